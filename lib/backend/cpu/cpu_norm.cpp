// LayerNorm and RMSNorm over the last dimension, with the optional fused residual add of pre-norm
// blocks (residual += x; out = norm(residual)). One row per task; statistics are summed in double
// so the f32 results sit as close to the exact value as HF's f32 reductions do, or closer.
#include <cmath>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/tensor_checks.hpp"

namespace xserv::cpu {
namespace {

// Sums in double over 8 interleaved partial sums: one running sum is a chain of dependent adds
// (4 cycles each, not vectorised without reassociation), which made a 768-wide LayerNorm row
// cost ~3 us and GPT-2's prefill norms scale worse than its GEMMs (docs/benchmarks.md).
constexpr int kLanes = 8;
double sum(const float* x, std::int64_t n) {
  double s[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) s[l] += static_cast<double>(x[i + l]);
  double t = 0.0;
  for (int l = 0; l < kLanes; ++l) t += s[l];
  for (; i < n; ++i) t += x[i];
  return t;
}
// sum((x - c)^2)
double sum_sq(const float* x, std::int64_t n, double c) {
  double s[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double v = static_cast<double>(x[i + l]) - c;
      s[l] += v * v;
    }
  double t = 0.0;
  for (int l = 0; l < kLanes; ++l) t += s[l];
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]) - c;
    t += v * v;
  }
  return t;
}

}  // namespace

void CpuBackend::norm(const char* op, Tensor out, const Tensor& x, Tensor residual,
                      const Tensor& weight, const Tensor& bias, float eps, bool rms) {
  check_dtype(op, "x", x, DType::f32);
  check_dtype(op, "out", out, DType::f32);
  check_float(op, "weight", weight);
  const std::int64_t d = x.shape.back(), rows = rows_of(x);
  XSERV_CHECK(x.shape.rank() >= 1 && d > 0, ErrorCode::invalid_argument, "{}: x has shape {}", op,
              x.shape);
  check_shape(op, "out", out, x.shape);
  check_shape(op, "weight", weight, Shape{d});
  if (!bias.empty()) {
    check_float(op, "bias", bias);
    check_shape(op, "bias", bias, Shape{d});
  }
  const bool fused = !residual.empty();
  if (fused) {
    check_dtype(op, "residual", residual, DType::f32);
    check_shape(op, "residual", residual, x.shape);
  }
  check_data(op, "x", x);
  check_data(op, "out", out);
  const F32View w(weight), b(bias);
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t begin, std::size_t end) {
    for (std::size_t r = begin; r < end; ++r) {
      const std::int64_t off = static_cast<std::int64_t>(r) * d;
      const float* src = x.as<const float>() + off;
      if (fused) {
        float* res = residual.as<float>() + off;
        for (std::int64_t i = 0; i < d; ++i) res[i] += src[i];
        src = res;
      }
      float* o = out.as<float>() + off;
      const float* wv = w.get();
      if (rms) {
        const double ss = sum_sq(src, d, 0.0);
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
        for (std::int64_t i = 0; i < d; ++i) o[i] = wv[i] * (src[i] * inv);
      } else {
        const double mean = sum(src, d) / static_cast<double>(d);
        const double var = sum_sq(src, d, mean);
        const auto meanf = static_cast<float>(mean);
        const float inv = 1.0f / std::sqrt(static_cast<float>(var / static_cast<double>(d)) + eps);
        if (const float* bv = b.get())
          for (std::int64_t i = 0; i < d; ++i) o[i] = (src[i] - meanf) * inv * wv[i] + bv[i];
        else
          for (std::int64_t i = 0; i < d; ++i) o[i] = (src[i] - meanf) * inv * wv[i];
      }
    }
  }, 4);
}

void CpuBackend::layer_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                            const Tensor& bias, float eps) {
  norm("layer_norm", out, x, residual, weight, bias, eps, false);
}

void CpuBackend::rms_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                          float eps) {
  norm("rms_norm", out, x, residual, weight, Tensor{}, eps, true);
}

}  // namespace xserv::cpu
