#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "support/temp_dir.hpp"

using namespace xserv;

TEST_CASE("MappedFile maps a file's bytes", "[core][io]") {
  test::TempDir dir;
  auto path = dir.write("a.bin", "hello world");
  MappedFile f(path);
  REQUIRE(f.size() == 11);
  CHECK(std::string(reinterpret_cast<const char*>(f.data()), f.size()) == "hello world");
  MappedFile moved = std::move(f);
  CHECK(moved.size() == 11);
  CHECK(f.data() == nullptr);
  CHECK(read_file(path) == "hello world");
}

TEST_CASE("MappedFile maps an empty file and reports missing ones", "[core][io]") {
  test::TempDir dir;
  MappedFile empty(dir.write("empty", ""));
  CHECK(empty.size() == 0);
  try {
    MappedFile missing(dir.file("nope"));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::not_found);
    CHECK_THAT(e.what(), Catch::Contains("nope"));
  }
  CHECK_THROWS_AS(MappedFile(dir.path().string()), Error);  // a directory
  CHECK_THROWS_AS(read_file(dir.file("nope")), Error);
}

TEST_CASE("MappedFile release_pages drops resident pages and the bytes read back the same",
          "[core][io]") {
  test::TempDir dir;
  std::string content(5 * 4096 + 123, '\0');
  for (std::size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 31 + 7);
  MappedFile f(dir.write("w.bin", content));
  REQUIRE(f.size() == content.size());
  const auto sum = [&] {
    std::uint64_t s = 0;
    for (std::size_t i = 0; i < f.size(); ++i) s = s * 131 + f.data()[i];
    return s;
  };
  const std::uint64_t before = sum();
  // Whole map, an unaligned interior range and ranges outside it (ignored).
  f.release_pages(f.data(), f.size());
  f.release_pages(f.data() + 100, 3 * 4096);
  f.release_pages(content.data(), content.size());
  CHECK(f.contains(f.data() + f.size() - 1));
  CHECK_FALSE(f.contains(f.data() + f.size()));
  CHECK(sum() == before);
  CHECK(std::string(reinterpret_cast<const char*>(f.data()), f.size()) == content);
}
