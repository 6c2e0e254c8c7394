#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>

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

TEST_CASE("MappedFile and read_file refuse a FIFO or a device without blocking", "[core][io]") {
  test::TempDir dir;
  const std::string fifo = dir.file("config.json");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // No writer ever opens the FIFO: a blocking open would hang this test (ctest's timeout).
  auto refused = [](auto&& read, const std::string& path, const char* kind) {
    try {
      read(path);
      FAIL("read " << path);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::io);
      CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains(kind));
    }
  };
  refused([](const std::string& p) { MappedFile f(p); }, fifo, "FIFO");
  refused([](const std::string& p) { read_file(p); }, fifo, "FIFO");
  refused([](const std::string& p) { read_file(p); }, "/dev/zero", "character device");
  refused([](const std::string& p) { MappedFile f(p); }, "/dev/urandom", "character device");
}

TEST_CASE("read_file stops at its size cap", "[core][io]") {
  test::TempDir dir;
  const std::string path = dir.write("big.json", std::string(100, ' '));
  CHECK(read_file(path, 100).size() == 100);
  try {
    read_file(path, 99);
    FAIL("read past the cap");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::format);
    CHECK_THAT(e.what(), Catch::Contains("100 bytes") && Catch::Contains("99"));
  }
  // The default cap: a sparse 17 MiB config.json is refused before any of it is read.
  const std::string sparse = dir.file("sparse.json");
  { std::ofstream(sparse).put(' '); }
  REQUIRE(::truncate(sparse.c_str(), 17 << 20) == 0);
  CHECK_THROWS_AS(read_file(sparse), Error);
  CHECK(read_file(dir.write("empty", ""), 0).empty());
}
