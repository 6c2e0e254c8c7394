#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "tensor/buffer.hpp"

using namespace xserv;

TEST_CASE("Shape basics", "[tensor]") {
  Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(fmt::format("{}", s) == "[2, 3, 4]");
  CHECK(Shape{} .numel() == 1);
  CHECK(s == Shape{2, 3, 4});
  CHECK_FALSE(s == Shape{2, 3});
  CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5}), Error);
  CHECK_THROWS_AS((Shape{-1}), Error);
}

TEST_CASE("Buffer owns aligned host memory and moves", "[tensor]") {
  Buffer b(cpu_allocator(), 100);
  REQUIRE(b.data() != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
  CHECK(b.size() == 100);
  CHECK(b.device().kind == DeviceKind::cpu);
  Buffer c = std::move(b);
  CHECK(c.size() == 100);
  CHECK_FALSE(static_cast<bool>(b));
}

TEST_CASE("Tensor views: rows and reshape", "[tensor]") {
  float data[12];
  for (int i = 0; i < 12; ++i) data[i] = static_cast<float>(i);
  Tensor t(data, DType::f32, Shape{4, 3});
  CHECK(t.bytes() == 48);
  Tensor r = t.rows(1, 2);
  CHECK(r.shape == Shape{2, 3});
  CHECK(r.as<float>()[0] == 3.0f);
  CHECK_THROWS_AS(t.rows(3, 2), Error);
  Tensor flat = t.reshape(Shape{12});
  CHECK(flat.numel() == 12);
  CHECK_THROWS_AS(t.reshape(Shape{5}), Error);
}
