// Element types and the f16/bf16 <-> f32 conversions the CPU backend and the loaders use.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace xserv {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64, u8 };

std::size_t dtype_size(DType t) noexcept;
std::string_view dtype_name(DType t) noexcept;  // "f32", "bf16", ...
// safetensors spelling ("F32", "BF16", "I64", ...); nullopt for a dtype xserv does not handle.
std::optional<DType> dtype_from_safetensors(std::string_view name) noexcept;
// config.json's torch_dtype/dtype ("float32", "bfloat16", "float16").
std::optional<DType> dtype_from_torch(std::string_view name) noexcept;
inline bool is_float(DType t) noexcept { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// bf16 is the top half of an f32; rounding to nearest even, NaN kept quiet.
inline float bf16_to_f32(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}
inline std::uint16_t f32_to_bf16(float f) noexcept {
  auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
// IEEE half precision, with subnormals, infinities and NaN; round to nearest even.
float f16_to_f32(std::uint16_t h) noexcept;
std::uint16_t f32_to_f16(float f) noexcept;

// Reads element i of a float buffer of type t as f32 (t must be f32, f16 or bf16).
inline float load_as_f32(const void* data, DType t, std::size_t i) noexcept {
  switch (t) {
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(data)[i]);
    default: return 0.0f;
  }
}
// Converts n floats from `src` of type `from` to f32.
void convert_to_f32(const void* src, DType from, float* dst, std::size_t n) noexcept;
// Converts n f32 values to a float type.
void convert_from_f32(const float* src, void* dst, DType to, std::size_t n) noexcept;

}  // namespace xserv
