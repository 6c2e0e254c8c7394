// Helpers for the CUDA backend tests: each op runs on the GPU and on the CPU reference backend
// with the same inputs (16-bit runs feed the CPU the bf16-rounded values, so only the GPU's
// arithmetic differs), GPU outputs are poisoned with NaN first, and results are compared with
// tolerances stated at each call.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "cuda/cuda_backend.hpp"
#include "support/scoped_env.hpp"

// Every CUDA test starts with this: CI has nvcc but no GPU, and a missing device is a skip.
#define XSERV_REQUIRE_CUDA_DEVICE()                  \
  do {                                               \
    if (!::xserv::cuda::device_available()) {        \
      WARN("no CUDA device: test skipped");          \
      return;                                        \
    }                                                \
  } while (0)

namespace xserv::test {

// One CUDA backend per value of an environment variable the backend reads at construction.
inline std::vector<std::unique_ptr<Backend>> backends_by_env(const char* name, const std::vector<const char*>& values) {
  std::vector<std::unique_ptr<Backend>> out;
  for (const char* v : values) {
    const ScopedEnv env(name, v);
    out.push_back(cuda::make_cuda_backend(BackendOptions{}));
  }
  return out;
}

inline std::vector<float> randn(std::mt19937& rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Rounds values through `dt` in place (what a bf16 tensor can hold).
inline void round_through(std::vector<float>& v, DType dt) {
  if (dt == DType::f32) return;
  std::vector<std::uint16_t> h(v.size());
  convert_from_f32(v.data(), h.data(), dt, v.size());
  convert_to_f32(h.data(), dt, v.data(), v.size());
}

class GpuCpu {
 public:
  GpuCpu() : gpu(cuda::make_cuda_backend(BackendOptions{})), cpu(BackendOptions{2, 0}) {}

  // A GPU tensor holding `v` converted to dt.
  Tensor gpu_tensor(const std::vector<float>& v, DType dt, Shape s) {
    REQUIRE(static_cast<std::int64_t>(v.size()) == s.numel());
    Buffer& b = keep_.emplace_back(gpu->allocator(), std::max<std::size_t>(v.size() * dtype_size(dt), 4));
    Tensor t(b.data(), dt, s, gpu->device());
    if (dt == DType::f32) {
      gpu->upload(t, v.data());
    } else {
      std::vector<std::uint16_t> h(v.size());
      convert_from_f32(v.data(), h.data(), dt, v.size());
      gpu->upload(t, h.data());
    }
    return t;
  }
  Tensor gpu_ints(const std::vector<std::int32_t>& v, Shape s) {
    Buffer& b = keep_.emplace_back(gpu->allocator(), std::max<std::size_t>(v.size() * 4, 4));
    Tensor t(b.data(), DType::i32, s, gpu->device());
    gpu->upload(t, v.data());
    return t;
  }
  // A GPU tensor filled with NaN (all-ones bytes are NaN in f32 and bf16).
  Tensor gpu_poisoned(DType dt, Shape s) {
    const std::size_t bytes = static_cast<std::size_t>(s.numel()) * dtype_size(dt);
    Buffer& b = keep_.emplace_back(gpu->allocator(), std::max<std::size_t>(bytes, 4));
    Tensor t(b.data(), dt, s, gpu->device());
    std::vector<std::uint8_t> ones(bytes, 0xFF);
    gpu->upload(t, ones.data());
    return t;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> out(static_cast<std::size_t>(t.numel()));
    if (t.dtype == DType::f32) {
      gpu->download(out.data(), t);
    } else {
      std::vector<std::uint16_t> h(out.size());
      gpu->download(h.data(), t);
      convert_to_f32(h.data(), t.dtype, out.data(), out.size());
    }
    return out;
  }

  std::unique_ptr<Backend> gpu;
  cpu::CpuBackend cpu;

 private:
  std::vector<Buffer> keep_;
};

inline Tensor host_view(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::f32, s); }
inline Tensor host_view(std::vector<std::int32_t>& v, Shape s) { return Tensor(v.data(), DType::i32, s); }

// |got - want| <= abs_tol + rel_tol * |want| everywhere (NaN fails); reports the first miss.
inline void require_close(const std::vector<float>& got, const std::vector<float>& want,
                          double abs_tol, double rel_tol) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= abs_tol + rel_tol * std::abs(static_cast<double>(want[i])))) {
      if (bad++ == 0) first = i;
    }
    if (err > worst || std::isnan(err)) worst = std::isnan(err) ? INFINITY : err;
  }
  INFO(bad << " of " << got.size() << " elements off; first " << first << ": got "
            << (bad ? got[first] : 0.0f) << ", want " << (bad ? want[first] : 0.0f)
            << "; worst abs error " << worst);
  REQUIRE(bad == 0);
}

}  // namespace xserv::test
