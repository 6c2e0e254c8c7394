// Token embedding (+ learned positions): out[t, :] = table[ids[t], :] + pos_table[positions[t], :].
// Layout: table [vocab, dim], pos_table [n_positions, dim], out [rows, dim], all row-major in
// the activation dtype. Launch: one block of 256 threads per row, threads stride over the dim.
// An id or position out of range yields a NaN row rather than a wild read (the host validated
// the batch; this only guards the device). Rows of whole aligned 16-byte vectors take
// embedding_vec_kernel (loads before stores; XSERV_CUDA_EMBED_VEC=0: the scalar loop).
// resolve_tokens: the input ids of an overlapped step (Backend::resolve_tokens): a negative id t
// becomes sampled[-t - 1], the previous step's id that never went through the host. One block
// (a decode batch's few hundred ids at most), plainly launched before the step's graph.
// prepare_decode: the same resolve from the host's ids (token_src), after advancing a decode
// batch that stayed on the device (positions, slots, context lengths +1; CudaBackend::
// upload_decode_batch decides when that gives the step's batch exactly).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

template <typename T>
__global__ void embedding_kernel(T* out, const std::int32_t* ids, const T* table, const T* pos_table,
                                 const std::int32_t* positions, std::int64_t dim,
                                 std::int64_t vocab, std::int64_t n_positions) {
  allow_dependents();  // a following GEMV may start loading its weights
  const std::int64_t row = blockIdx.x;
  const std::int64_t id = ids[row];
  const std::int64_t pos = pos_table ? positions[row] : 0;
  const bool ok = id >= 0 && id < vocab && (!pos_table || (pos >= 0 && pos < n_positions));
  T* o = out + row * dim;
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = CUDART_NAN_F;
    if (ok) {
      v = to_f32(table[id * dim + i]);
      if (pos_table) v += to_f32(pos_table[pos * dim + i]);
    }
    o[i] = from_f32<T>(v);
  }
}

// The same rows with 16-byte vectors, every load of a thread issued before its stores (rows
// whose width is a whole number of 16-byte vectors, aligned; the default, XSERV_CUDA_EMBED_VEC=0
// the scalar loop). The scalar loop above stores each element before it loads the next (out may
// alias table as far as the compiler knows), so a thread's 8 elements of a 2048-wide bf16 row
// were 8 dependent DRAM round trips on the critical path of every decode step (5.7 us of
// Qwen3-1.7B's step, the first kernel of its chain). The same arithmetic per element: the same
// bits. Qwen3-1.7B b1 869.7 / 870.2 -> 871.2 / 871.4 tok/s, 0.6B 1478.9 / 1479.8 -> 1480.9 /
// 1480.6 (docs/benchmarks.md, "Batch-1 decode of Qwen3-1.7B: a CUPTI profile").
constexpr int embed_vec_ahead = 4;  // vectors a thread loads before it stores
template <typename T>
__global__ void embedding_vec_kernel(T* out, const std::int32_t* ids, const T* table, const T* pos_table,
                                     const std::int32_t* positions, std::int64_t dim, std::int64_t vocab,
                                     std::int64_t n_positions) {
  allow_dependents();  // a following GEMV may start loading its weights
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  const std::int64_t row = blockIdx.x;
  const std::int64_t id = ids[row];
  const std::int64_t pos = pos_table ? positions[row] : 0;
  const bool ok = id >= 0 && id < vocab && (!pos_table || (pos >= 0 && pos < n_positions));
  const std::int64_t nvec = dim / V;
  const uint4* tv = reinterpret_cast<const uint4*>(table) + (ok ? id : 0) * nvec;
  const uint4* pv = pos_table ? reinterpret_cast<const uint4*>(pos_table) + (ok ? pos : 0) * nvec : nullptr;
  uint4* ov = reinterpret_cast<uint4*>(out) + row * nvec;
  for (std::int64_t base = threadIdx.x; base < nvec; base += embed_vec_ahead * blockDim.x) {
    uint4 a[embed_vec_ahead], b[embed_vec_ahead];
#pragma unroll
    for (int u = 0; u < embed_vec_ahead; ++u) {
      const std::int64_t i = base + u * blockDim.x;
      if (ok && i < nvec) {
        a[u] = tv[i];
        if (pv) b[u] = pv[i];
      }
    }
#pragma unroll
    for (int u = 0; u < embed_vec_ahead; ++u) {
      const std::int64_t i = base + u * blockDim.x;
      if (i >= nvec) break;
      const T* ta = reinterpret_cast<const T*>(&a[u]);
      const T* tb = reinterpret_cast<const T*>(&b[u]);
      uint4 o;
      T* to = reinterpret_cast<T*>(&o);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        float v = CUDART_NAN_F;
        if (ok) {
          v = to_f32(ta[e]);
          if (pv) v += to_f32(tb[e]);
        }
        to[e] = from_f32<T>(v);
      }
      ov[i] = o;
    }
  }
}

__global__ void resolve_tokens_kernel(std::int32_t* tokens, std::int64_t n,
                                      const std::int32_t* sampled) {
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const std::int32_t t = tokens[i];
    if (t < 0) tokens[i] = sampled[-static_cast<std::int64_t>(t) - 1];
  }
}

// One block: every thread reads control[0] before thread 0 sets it (the barrier between).
__global__ void prepare_decode_kernel(std::int32_t* tokens, const std::int32_t* token_src,
                                      std::int32_t* positions, std::int32_t* slots,
                                      std::int32_t* context_lens, std::int32_t* control,
                                      std::int64_t n, const std::int32_t* sampled) {
  const bool advance = control[0] != 0;
  const std::int64_t growing = control[1];
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (advance && i < growing) {
      ++positions[i];
      ++slots[i];
      ++context_lens[i];
    }
    const std::int32_t t = token_src[i];
    tokens[i] = t < 0 ? sampled[-static_cast<std::int64_t>(t) - 1] : t;
  }
  __syncthreads();
  if (threadIdx.x == 0) control[0] = 1;
}

}  // namespace

void launch_prepare_decode(cudaStream_t stream, std::int32_t* tokens, const std::int32_t* token_src,
                           std::int32_t* positions, std::int32_t* slots, std::int32_t* context_lens,
                           std::int32_t* control, std::int64_t n, const std::int32_t* sampled) {
  if (n == 0) return;
  prepare_decode_kernel<<<1, 256, 0, stream>>>(tokens, token_src, positions, slots, context_lens,
                                               control, n, sampled);
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_resolve_tokens(cudaStream_t stream, std::int32_t* tokens, std::int64_t n,
                           const std::int32_t* sampled) {
  if (n == 0) return;
  resolve_tokens_kernel<<<1, 256, 0, stream>>>(tokens, n, sampled);
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_embedding(cudaStream_t stream, DType dt, void* out, const std::int32_t* ids,
                      const void* table, const void* pos_table, const std::int32_t* positions,
                      std::int64_t rows, std::int64_t dim, std::int64_t vocab,
                      std::int64_t n_positions) {
  if (rows == 0) return;
  // embedding_vec_kernel unless XSERV_CUDA_EMBED_VEC=0 (read at every call).
  const char* env = std::getenv("XSERV_CUDA_EMBED_VEC");
  const std::size_t es = dt == DType::f32 ? 4 : 2;
  const auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if ((env == nullptr || std::string_view(env) != "0") && (dim * static_cast<std::int64_t>(es)) % 16 == 0 &&
      aligned(out) && aligned(table) && aligned(pos_table)) {
    if (dt == DType::f32) {
      embedding_vec_kernel<float><<<rows, 256, 0, stream>>>(
          static_cast<float*>(out), ids, static_cast<const float*>(table), static_cast<const float*>(pos_table),
          positions, dim, vocab, n_positions);
    } else {
      embedding_vec_kernel<__nv_bfloat16><<<rows, 256, 0, stream>>>(
          static_cast<__nv_bfloat16*>(out), ids, static_cast<const __nv_bfloat16*>(table),
          static_cast<const __nv_bfloat16*>(pos_table), positions, dim, vocab, n_positions);
    }
    XSERV_CUDA_LAUNCH_CHECK();
    return;
  }
  if (dt == DType::f32) {
    embedding_kernel<float><<<rows, 256, 0, stream>>>(
        static_cast<float*>(out), ids, static_cast<const float*>(table),
        static_cast<const float*>(pos_table), positions, dim, vocab, n_positions);
  } else {
    embedding_kernel<__nv_bfloat16><<<rows, 256, 0, stream>>>(
        static_cast<__nv_bfloat16*>(out), ids, static_cast<const __nv_bfloat16*>(table),
        static_cast<const __nv_bfloat16*>(pos_table), positions, dim, vocab, n_positions);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
