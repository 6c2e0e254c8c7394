// Helpers for the CPU backend tests: random data, weights stored in each float dtype, and the
// comparison used against the naive references written in the tests.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tensor/buffer.hpp"
#include "tensor/dtype.hpp"

namespace xserv::test {

inline std::vector<float> random_floats(std::mt19937& rng, std::size_t n, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A weight held in one dtype; `values` are exactly what the backend reads, as f32.
struct TypedWeight {
  DType dtype = DType::f32;
  std::vector<std::uint16_t> half;
  std::vector<float> values;
  Tensor tensor(Shape s) {
    void* p = dtype == DType::f32 ? static_cast<void*>(values.data()) : half.data();
    return Tensor(p, dtype, s);
  }
};

inline TypedWeight make_weight(std::mt19937& rng, std::size_t n, DType dtype, float lo = -1.0f,
                               float hi = 1.0f) {
  TypedWeight w;
  w.dtype = dtype;
  w.values = random_floats(rng, n, lo, hi);
  if (dtype != DType::f32) {
    w.half.resize(n);
    convert_from_f32(w.values.data(), w.half.data(), dtype, n);
    convert_to_f32(w.half.data(), dtype, w.values.data(), n);
  }
  return w;
}

inline Tensor view(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::f32, s); }
inline Tensor view(std::vector<std::int32_t>& v, Shape s) { return Tensor(v.data(), DType::i32, s); }

// |got - want| <= abs_tol + rel_tol * |want| element by element; reports the first miss.
inline void require_close(const std::vector<float>& got, const std::vector<double>& want,
                          double abs_tol, double rel_tol) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= abs_tol + rel_tol * std::abs(want[i]))) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      REQUIRE(err <= abs_tol + rel_tol * std::abs(want[i]));
    }
  }
}

}  // namespace xserv::test
