#include "backend/backend.hpp"

#include <algorithm>

#include "backend/cpu/cpu_backend.hpp"
#include "core/error.hpp"

#ifdef XSERV_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace xserv {

void Backend::gemm_parts(Tensor out, const Tensor& a, std::span<const Tensor> ws,
                         std::span<const Tensor> biases) {
  check_gemm_parts(out, ws, biases);
  const std::int64_t width = out.shape[1];
  std::int64_t col = 0;
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const std::int64_t n = ws[i].shape[0];
    gemm(column_slice(out, col, n), a, ws[i], WeightLayout::out_in,
         biases.empty() ? Tensor{} : biases[i], 0.0f, width);
    col += n;
  }
}

void check_gemm_parts(const Tensor& out, std::span<const Tensor> ws, std::span<const Tensor> biases) {
  XSERV_CHECK(biases.empty() || biases.size() == ws.size(), ErrorCode::invalid_argument,
              "gemm_parts: {} biases for {} weights", biases.size(), ws.size());
  XSERV_CHECK(out.shape.rank() == 2, ErrorCode::invalid_argument,
              "gemm_parts: out {} must be 2-D", out.shape);
  std::int64_t cols = 0;
  for (const Tensor& w : ws) {
    XSERV_CHECK(w.shape.rank() == 2, ErrorCode::invalid_argument,
                "gemm_parts: weight {} must be 2-D", w.shape);
    cols += w.shape[0];
  }
  XSERV_CHECK(cols == out.shape[1], ErrorCode::invalid_argument,
              "gemm_parts: the weights give {} columns, out {} has {}", cols, out.shape, out.shape[1]);
}

Tensor column_slice(const Tensor& packed, std::int64_t col, std::int64_t n) {
  auto* base = static_cast<std::uint8_t*>(packed.data) +
               static_cast<std::size_t>(col) * dtype_size(packed.dtype);
  return Tensor(base, packed.dtype, {packed.shape[0], n}, packed.device);
}

void Backend::rms_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight, float eps,
                            const Tensor& w, bool swiglu, Tensor h_scratch, Tensor y_scratch) {
  rms_norm(h_scratch, x, {}, norm_weight, eps);
  if (!swiglu) {
    gemm(out, h_scratch, w, WeightLayout::out_in, {});
    return;
  }
  gemm(y_scratch, h_scratch, w, WeightLayout::out_in, {});
  this->swiglu(out, y_scratch);
}

void Backend::gemm_rms_norm_gemm(Tensor x, const Tensor& a, const Tensor& w_res, const Tensor& norm_weight,
                                 float eps, const Tensor& w, bool swiglu, Tensor out, Tensor h_scratch,
                                 Tensor y_scratch) {
  gemm(x, a, w_res, WeightLayout::out_in, {}, 1.0f);
  rms_norm_gemm(out, x, norm_weight, eps, w, swiglu, h_scratch, y_scratch);
}

void Backend::rms_norm_mlp(Tensor x, const Tensor& norm_weight, float eps, const Tensor& gate_up_w,
                           const Tensor& down_w, Tensor act_scratch, Tensor h_scratch, Tensor y_scratch) {
  rms_norm_gemm(act_scratch, x, norm_weight, eps, gate_up_w, true, h_scratch, y_scratch);
  gemm(x, act_scratch, down_w, WeightLayout::out_in, {}, 1.0f);
}

void Backend::layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                              const Tensor& norm_bias, float eps, const Tensor& w,
                              WeightLayout layout, const Tensor& bias, bool gelu,
                              Tensor h_scratch) {
  layer_norm(h_scratch, x, {}, norm_weight, norm_bias, eps);
  gemm(out, h_scratch, w, layout, bias);
  if (gelu) this->gelu(out);
}

void Backend::qk_attention(Tensor out, Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                           const DeviceBatch& batch, KvLayer cache, float scale) {
  qk_transform_store(qkv, heads, t, batch, cache);
  attention(out, qkv, heads, batch, cache, scale);
}

std::uint64_t Backend::sample_async(Tensor, const SamplingBatch&, Tensor) {
  throw Error(ErrorCode::internal, fmt::format("{}: no asynchronous sampling", name()));
}

void Backend::wait_sampled(std::uint64_t, std::int32_t*) {
  throw Error(ErrorCode::internal, fmt::format("{}: no asynchronous sampling", name()));
}

void Backend::resolve_tokens(Tensor, const Tensor&) {
  throw Error(ErrorCode::internal, fmt::format("{}: no asynchronous sampling", name()));
}

std::int32_t ForwardBatch::max_query_len() const noexcept {
  std::int32_t m = 0;
  for (std::size_t s = 0; s + 1 < query_start.size(); ++s)
    m = std::max(m, query_start[s + 1] - query_start[s]);
  return m;
}

std::int32_t ForwardBatch::max_context_len() const noexcept {
  std::int32_t m = 0;
  for (auto c : context_lens) m = std::max(m, c);
  return m;
}

void ForwardBatch::validate(std::int32_t block_size) const {
  const auto t = token_ids.size();
  const auto s = context_lens.size();
  XSERV_CHECK(positions.size() == t && slot_mapping.size() == t, ErrorCode::invalid_argument,
              "batch: {} tokens but {} positions and {} slots", t, positions.size(),
              slot_mapping.size());
  XSERV_CHECK(query_start.size() == s + 1 && query_start.front() == 0 &&
                  query_start.back() == static_cast<std::int32_t>(t),
              ErrorCode::invalid_argument, "batch: query_start must run from 0 to {} over {} sequences", t, s);
  XSERV_CHECK(block_size > 0 && max_blocks_per_seq >= 0 &&
                  block_tables.size() == s * static_cast<std::size_t>(max_blocks_per_seq),
              ErrorCode::invalid_argument, "batch: block_tables has {} entries, expected {} x {}",
              block_tables.size(), s, max_blocks_per_seq);
  for (std::size_t i = 0; i < s; ++i) {
    std::int32_t q = query_start[i + 1] - query_start[i];
    XSERV_CHECK(q >= 0 && context_lens[i] >= q, ErrorCode::invalid_argument,
                "batch: sequence {} has {} new tokens but a context of {}", i, q, context_lens[i]);
    XSERV_CHECK((context_lens[i] + block_size - 1) / block_size <= max_blocks_per_seq,
                ErrorCode::invalid_argument, "batch: sequence {} needs more than {} blocks", i,
                max_blocks_per_seq);
  }
  for (std::size_t i = 0; i < t; ++i)
    XSERV_CHECK(positions[i] >= 0 && slot_mapping[i] >= 0, ErrorCode::invalid_argument,
                "batch: row {} has position {} and slot {}", i, positions[i], slot_mapping[i]);
  for (std::size_t i = 0; i < logit_rows.size(); ++i)
    XSERV_CHECK(logit_rows[i] >= 0 && logit_rows[i] < static_cast<std::int32_t>(t) &&
                    (i == 0 || logit_rows[i] > logit_rows[i - 1]),
                ErrorCode::invalid_argument, "batch: logit row {} is out of order or range", i);
}

float sampling_uniform(std::uint64_t seed, std::uint64_t step) noexcept {
  // splitmix64 of the pair: counter-based, so any backend can compute a row's draw in isolation.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact in a float
}

std::unique_ptr<Backend> make_backend(DeviceKind kind, const BackendOptions& options) {
  switch (kind) {
    case DeviceKind::cpu: return std::make_unique<cpu::CpuBackend>(options);
    case DeviceKind::cuda:
#ifdef XSERV_HAVE_CUDA
      return cuda::make_cuda_backend(options);
#else
      throw_error(ErrorCode::unsupported, "xserv was built without the CUDA backend");
#endif
  }
  throw_error(ErrorCode::invalid_argument, "make_backend: unknown device kind {}",
              static_cast<int>(kind));
}

bool cuda_available() noexcept {
#ifdef XSERV_HAVE_CUDA
  return cuda::device_available();
#else
  return false;
#endif
}

}  // namespace xserv
