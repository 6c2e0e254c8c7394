#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "support/safetensors_writer.hpp"
#include "support/temp_dir.hpp"

using namespace xserv;
using test::SafetensorsWriter;

namespace {

SafetensorsWriter two_tensors() {
  SafetensorsWriter w;
  w.add_f32("a", {2, 3}, {1, 2, 3, 4, 5, 6});
  w.add("b", "BF16", {2}, std::string("\x80\x3f\x00\x40", 4));  // 1.0, 2.0
  return w;
}

// Opening must fail with `code` and a message that contains `needle`.
void expect_error(const std::string& path, ErrorCode code, const std::string& needle) {
  try {
    SafetensorsFile::open(path);
    FAIL("opened a corrupt file: " << needle);
  } catch (const Error& e) {
    CHECK(e.code() == code);
    CHECK_THAT(e.what(), Catch::Contains(needle));
  }
}

}  // namespace

TEST_CASE("safetensors: zero-copy views of a valid file", "[io][safetensors]") {
  test::TempDir dir;
  auto w = two_tensors();
  auto path = dir.write("model.safetensors", w.file());
  auto f = SafetensorsFile::open(path);
  REQUIRE(f.tensors().size() == 2);
  const TensorInfo* a = f.find("a");
  REQUIRE(a != nullptr);
  CHECK(a->dtype == DType::f32);
  CHECK(a->shape == Shape{2, 3});
  CHECK(reinterpret_cast<const float*>(a->data)[5] == 6.0f);
  const TensorInfo* b = f.find("b");
  REQUIRE(b != nullptr);
  CHECK(bf16_to_f32(reinterpret_cast<const std::uint16_t*>(b->data)[1]) == 2.0f);
  CHECK(f.find("c") == nullptr);
}

TEST_CASE("safetensors: metadata and scalars", "[io][safetensors]") {
  test::TempDir dir;
  std::string header = R"({"__metadata__":{"format":"pt"},"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})";
  while (header.size() % 8) header += ' ';  // writers pad the header so data is aligned
  auto path = dir.write("m.safetensors", SafetensorsWriter::file(header, std::string(8, '\x01')));
  auto f = SafetensorsFile::open(path);
  CHECK(f.metadata().at("format") == "pt");
  REQUIRE(f.find("s") != nullptr);
  CHECK(f.find("s")->shape.rank() == 0);
}

TEST_CASE("safetensors: malformed files are clear errors", "[io][safetensors]") {
  test::TempDir dir;
  auto w = two_tensors();
  const std::string good = w.file();

  expect_error(dir.write("short", "abc"), ErrorCode::format, "too short");
  expect_error(dir.write("trunc", good.substr(0, 20)), ErrorCode::format, "header length");
  std::string huge = good;
  huge[7] = '\x7f';  // header length ~ 2^63
  expect_error(dir.write("huge", huge), ErrorCode::format, "header length");
  // Data cut off: the ranges now leave the file.
  expect_error(dir.write("cut", good.substr(0, good.size() - 3)), ErrorCode::format, "outside");

  auto with_header = [&](const std::string& name, std::string header) {
    while (header.size() % 8) header += ' ';
    return dir.write(name, SafetensorsWriter::file(header, w.data()));
  };
  expect_error(with_header("json", "{\"a\": {\"dtype\": "), ErrorCode::format, "invalid JSON");
  expect_error(with_header("notobj", "[1,2]"), ErrorCode::format, "not a JSON object");
  expect_error(with_header("dtype", R"({"a":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})"),
               ErrorCode::format, "unsupported dtype 'F8_E5M2'");
  expect_error(with_header("size", R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})"),
               ErrorCode::format, "expected 24");
  expect_error(with_header("order", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})"),
               ErrorCode::format, "outside");
  expect_error(with_header("overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
               ErrorCode::format, "overlap");
  expect_error(with_header("negshape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"),
               ErrorCode::format, "non-negative");
  expect_error(with_header("noshape", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})"),
               ErrorCode::format, "no shape");
  expect_error(with_header("nooffsets", R"({"a":{"dtype":"F32","shape":[2]}})"), ErrorCode::format,
               "data_offsets");
  expect_error(with_header("bigshape", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})"),
               ErrorCode::format, "impossible shape");
  expect_error(with_header("unaligned", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})"),
               ErrorCode::format, "aligned");
  expect_error(dir.file("missing.safetensors"), ErrorCode::not_found, "missing.safetensors");
}

TEST_CASE("checkpoint: single file, sharded with index, sharded without index", "[io][safetensors]") {
  SafetensorsWriter s1, s2;
  s1.add_f32("x", {2}, {1, 2});
  s2.add_f32("y", {1}, {3});

  test::TempDir single;
  single.write("model.safetensors", s1.file());
  auto c1 = Checkpoint::open(single.path().string());
  CHECK(c1.names() == std::vector<std::string>{"x"});
  CHECK(c1.view("x").as<float>()[1] == 2.0f);
  try {
    c1.view("nope");
    FAIL();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::not_found);
    CHECK_THAT(e.what(), Catch::Contains("'nope'"));
  }

  test::TempDir indexed;
  indexed.write("model-00001-of-00002.safetensors", s1.file());
  indexed.write("model-00002-of-00002.safetensors", s2.file());
  indexed.write("model.safetensors.index.json",
                R"({"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
  auto c2 = Checkpoint::open(indexed.path().string());
  CHECK(c2.names().size() == 2);
  CHECK(c2.view("y").as<float>()[0] == 3.0f);
  CHECK(c2.total_bytes() == 12);

  test::TempDir bare;
  bare.write("model-00001-of-00002.safetensors", s1.file());
  bare.write("model-00002-of-00002.safetensors", s2.file());
  CHECK(Checkpoint::open(bare.path().string()).names().size() == 2);
}

TEST_CASE("checkpoint: broken directories are clear errors", "[io][safetensors]") {
  SafetensorsWriter s1;
  s1.add_f32("x", {2}, {1, 2});

  test::TempDir empty;
  CHECK_THROWS_WITH(Checkpoint::open(empty.path().string()), Catch::Contains("no model.safetensors"));
  CHECK_THROWS_WITH(Checkpoint::open(empty.file("absent")), Catch::Contains("does not exist"));

  test::TempDir gap;
  gap.write("model-00001-of-00003.safetensors", s1.file());
  gap.write("model-00003-of-00003.safetensors", s1.file());
  CHECK_THROWS_WITH(Checkpoint::open(gap.path().string()), Catch::Contains("shard 2 of 3 is missing"));

  test::TempDir dup;
  dup.write("a.safetensors", s1.file());
  dup.write("b.safetensors", s1.file());
  dup.write("model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors","z":"b.safetensors"}})");
  CHECK_THROWS_WITH(Checkpoint::open(dup.path().string()), Catch::Contains("in both"));

  test::TempDir lying;
  lying.write("a.safetensors", s1.file());
  lying.write("model.safetensors.index.json", R"({"weight_map":{"x":"a.safetensors","w":"a.safetensors"}})");
  CHECK_THROWS_WITH(Checkpoint::open(lying.path().string()), Catch::Contains("'w'"));

  test::TempDir escape;
  escape.write("model.safetensors.index.json", R"({"weight_map":{"x":"../evil.safetensors"}})");
  CHECK_THROWS_WITH(Checkpoint::open(escape.path().string()), Catch::Contains("leaves the directory"));

  test::TempDir badjson;
  badjson.write("model.safetensors.index.json", "{not json");
  CHECK_THROWS_WITH(Checkpoint::open(badjson.path().string()), Catch::Contains("invalid JSON"));
}
