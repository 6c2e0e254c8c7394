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
