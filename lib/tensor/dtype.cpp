#include "tensor/dtype.hpp"

#include <cstring>

namespace xserv {

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view n) noexcept {
  if (n == "F32") return DType::f32;
  if (n == "F16") return DType::f16;
  if (n == "BF16") return DType::bf16;
  if (n == "I32") return DType::i32;
  if (n == "I64") return DType::i64;
  if (n == "U8") return DType::u8;
  return std::nullopt;
}

std::optional<DType> dtype_from_torch(std::string_view n) noexcept {
  if (n.starts_with("torch.")) n.remove_prefix(6);
  if (n == "float32" || n == "float") return DType::f32;
  if (n == "float16" || n == "half") return DType::f16;
  if (n == "bfloat16") return DType::bf16;
  return std::nullopt;
}

float f16_to_f32(std::uint16_t h) noexcept {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<std::uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

std::uint16_t f32_to_f16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (u >> 16) & 0x8000u;
  std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
    std::uint32_t exp = abs >> 23;
    std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126 - exp;  // 14 + (113 - exp)
    std::uint32_t half = mant >> shift;
    std::uint32_t rem = mant & ((1u << shift) - 1);
    std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even
  r -= 0x38000000u;                                      // rebias 127 -> 15
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

void convert_to_f32(const void* src, DType from, float* dst, std::size_t n) noexcept {
  if (from == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const auto* h = static_cast<const std::uint16_t*>(src);
  if (from == DType::bf16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
  }
}

void convert_from_f32(const float* src, void* dst, DType to, std::size_t n) noexcept {
  if (to == DType::f32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  auto* h = static_cast<std::uint16_t*>(dst);
  if (to == DType::bf16) {
    for (std::size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
  }
}

}  // namespace xserv
