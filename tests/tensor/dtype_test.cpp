#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "tensor/dtype.hpp"

using namespace xserv;

TEST_CASE("dtype sizes and names", "[tensor]") {
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(dtype_size(DType::u8) == 1);
  CHECK(dtype_from_safetensors("BF16") == DType::bf16);
  CHECK_FALSE(dtype_from_safetensors("F8_E4M3").has_value());
  CHECK(dtype_from_torch("torch.bfloat16") == DType::bf16);
  CHECK(dtype_from_torch("float16") == DType::f16);
  CHECK_FALSE(dtype_from_torch("int4").has_value());
}

TEST_CASE("every finite f16 value survives f16 -> f32 -> f16", "[tensor]") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    auto v = static_cast<std::uint16_t>(h);
    float f = f16_to_f32(v);
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    REQUIRE(f32_to_f16(f) == v);
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(f16_to_f32(0x7bff) == 65504.0f);
}

TEST_CASE("f32 -> f16 rounds to nearest even and saturates to infinity", "[tensor]") {
  CHECK(f32_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // halfway: down to even
  CHECK(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // halfway: up to even
  CHECK(f32_to_f16(65520.0f) == 0x7c00);
  CHECK(f32_to_f16(-1e10f) == 0xfc00);
  CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);  // halfway to the first subnormal: even
  CHECK(f32_to_f16(std::ldexp(1.5f, -25)) == 0x0001);
}

TEST_CASE("bf16 conversion rounds to nearest even", "[tensor]") {
  CHECK(f32_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_f32(0x3f80) == 1.0f);
  float halfway = std::bit_cast<float>(0x3f808000u);  // between 0x3f80 and 0x3f81
  CHECK(f32_to_bf16(halfway) == 0x3f80);
  float above = std::bit_cast<float>(0x3f808001u);
  CHECK(f32_to_bf16(above) == 0x3f81);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t h = 0; h < 0x10000; h += 7) {
    float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(f32_to_bf16(f) == h);
  }
}

TEST_CASE("bulk conversions match the scalar ones", "[tensor]") {
  float src[5] = {0.1f, -2.5f, 3.14159f, 1e-3f, 1000.0f};
  std::uint16_t half[5];
  float back[5];
  for (DType t : {DType::f16, DType::bf16}) {
    convert_from_f32(src, half, t, 5);
    convert_to_f32(half, t, back, 5);
    for (int i = 0; i < 5; ++i) {
      CHECK(back[i] == load_as_f32(half, t, static_cast<std::size_t>(i)));
      CHECK(back[i] == Approx(src[i]).epsilon(t == DType::bf16 ? 8e-3 : 1e-3));
    }
  }
}
