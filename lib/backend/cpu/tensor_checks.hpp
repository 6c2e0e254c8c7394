// Argument checks shared by the CPU ops: each failure is Error(invalid_argument) naming the op,
// the argument and what it got.
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "tensor/buffer.hpp"

namespace xserv::cpu {

inline void check_dtype(const char* op, const char* arg, const Tensor& t, DType want) {
  XSERV_CHECK(t.dtype == want, ErrorCode::invalid_argument, "{}: {} has dtype {}, expected {}",
              op, arg, dtype_name(t.dtype), dtype_name(want));
}

inline void check_float(const char* op, const char* arg, const Tensor& t) {
  XSERV_CHECK(is_float(t.dtype), ErrorCode::invalid_argument,
              "{}: {} has dtype {}, expected f32, f16 or bf16", op, arg, dtype_name(t.dtype));
}

inline void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& want) {
  XSERV_CHECK(t.shape == want, ErrorCode::invalid_argument, "{}: {} has shape {}, expected {}", op,
              arg, t.shape, want);
}

inline void check_data(const char* op, const char* arg, const Tensor& t) {
  XSERV_CHECK(t.numel() == 0 || t.data != nullptr, ErrorCode::invalid_argument,
              "{}: {} of shape {} has no data", op, arg, t.shape);
}

// A [rows, d] view of a tensor whose last dimension is d.
inline std::int64_t rows_of(const Tensor& t) {
  const std::int64_t d = t.shape.back();
  return d ? t.numel() / d : 0;
}

// A float weight vector as f32 (a copy only when it is not f32 already).
class F32View {
 public:
  explicit F32View(const Tensor& t) {
    if (t.empty()) return;
    if (t.dtype == DType::f32) {
      ptr_ = t.as<const float>();
    } else {
      copy_.resize(static_cast<std::size_t>(t.numel()));
      convert_to_f32(t.data, t.dtype, copy_.data(), copy_.size());
      ptr_ = copy_.data();
    }
  }
  const float* get() const noexcept { return ptr_; }

 private:
  const float* ptr_ = nullptr;
  std::vector<float> copy_;
};

}  // namespace xserv::cpu
