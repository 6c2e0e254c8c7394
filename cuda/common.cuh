// Device helpers shared by the kernel files: element conversions, vector loads, warp and block
// reductions. Activations are float (f32 models) or __nv_bfloat16 (bf16/f16 models); every
// kernel computes in f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// N consecutive elements starting at p (16-byte aligned when N * sizeof(T) is a multiple of 16)
// read into f32 registers with 16-byte loads.
template <typename T, int N>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[N]) {
  constexpr int per_vec = 16 / sizeof(T);
  if constexpr (N % per_vec == 0) {
#pragma unroll
    for (int v = 0; v < N / per_vec; ++v) {
      uint4 raw = reinterpret_cast<const uint4*>(p)[v];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < per_vec; ++i) out[v * per_vec + i] = to_f32(e[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f32(p[i]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[N]) {
  constexpr int per_vec = 16 / sizeof(T);
  if constexpr (N % per_vec == 0) {
#pragma unroll
    for (int v = 0; v < N / per_vec; ++v) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < per_vec; ++i) e[i] = from_f32<T>(in[v * per_vec + i]);
      reinterpret_cast<uint4*>(p)[v] = raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_f32<T>(in[i]);
  }
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 floats; the call starts with a barrier so scratch can be reused at once.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  x = warp_sum(x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  x = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(x);
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
  x = warp_max(x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  x = lane < warps ? scratch[lane] : -FLT_MAX;
  return warp_max(x);
}

// 16 bytes of a weight that is read once per kernel (decode GEMV/GEMM streams): non-coherent and
// kept out of L1 so the activations stay there. Volatile so a kernel's loads for its next step
// stay ahead of the arithmetic on the current one.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ---- Asynchronous copies global -> shared (cp.async, sm_80+) ---------------------------------
// 16 bytes from gmem to smem without passing through registers; commit groups them, wait<N>
// returns once at most N of the committed groups are still in flight. The zero-filling form
// copies nothing and writes 16 zero bytes when `valid` is false (gmem must still be a valid
// address then: the source size is 0).
__device__ __forceinline__ void copy_async16(void* smem, const void* gmem) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// At a shared-memory address (a warp's copies from one precomputed base: no conversion a copy).
__device__ __forceinline__ void copy_async16_zfill_at(unsigned smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy_async16_zfill(void* smem, const void* gmem, bool valid) {
  copy_async16_zfill_at(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- Bulk copies global -> shared counted on an mbarrier (cp.async.bulk, sm_90) ------------------
// A phase of an mbarrier made by mbar_init completes once its one arrival has come (mbar_expect_tx
// or bulk_load) and every byte that arrival announced has landed; mbar_wait(bar, parity) returns
// once the phase of that parity (0, 1, 0, ... for its successive uses) has completed.
// mbar_init_fence makes the initialisation visible to the copy engine before any copy uses it.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
               : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// The phase's arrival, announcing `bytes` that copies (bulk_copy) will complete on bar.
__device__ __forceinline__ void mbar_expect_tx(std::uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(bytes)
               : "memory");
#endif
}
// Bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared memory,
// completing its bytes on bar (whose phase must have announced them). With hint, the copy reads
// under the L2 cache policy pol (a createpolicy result).
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar,
                                          bool hint = false, std::uint64_t pol = 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const auto b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  if (hint) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(s),
        "l"(gmem), "r"(bytes), "r"(b), "l"(pol)
        : "memory");
  } else {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(s),
                 "l"(gmem), "r"(bytes), "r"(b)
                 : "memory");
  }
#endif
}
// One thread's whole phase: the arrival with the bytes of one bulk copy, and the copy.
__device__ __forceinline__ void bulk_load(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar,
                                          bool hint = false, std::uint64_t pol = 0) {
  mbar_expect_tx(bar, bytes);
  bulk_copy(smem, gmem, bytes, bar, hint, pol);
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra WAIT%=;\n}" ::"r"(
          static_cast<unsigned>(__cvta_generic_to_shared(bar))),
      "r"(parity)
      : "memory");
#endif
}

// ---- Asking the next kernel's weights into L2 (cp.async.bulk.prefetch, sm_90) -----------------
// A kernel whose own work leaves DRAM idle (it waits on the one before, or computes from what it
// already holds) can ask the next kernel's weight into L2, so that kernel starts on L2 hits
// instead of a DRAM round trip (GemvChain::l2_next, QkAttentionParams::l2_next).
// One bulk prefetch of [p, p + bytes): p and bytes multiples of 16 (a misaligned address faults).
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

// Part `part` of `parts` near-equal 16-byte-aligned slices of [base, base + bytes), into L2.
__device__ __forceinline__ void prefetch_slice_l2(const unsigned char* base, std::int64_t bytes, int part, int parts) {
  const std::int64_t units = bytes / 16;
  const std::int64_t lo = units * part / parts, hi = units * (part + 1) / parts;
  if (hi > lo) bulk_prefetch_l2(base + lo * 16, static_cast<unsigned>((hi - lo) * 16));
}

// The sequence a packed-batch row belongs to: the last sequence whose first row (query_start,
// num_seqs + 1 entries) is <= row, so sequences with no rows are skipped.
__device__ __forceinline__ int find_sequence(const std::int32_t* query_start, int num_seqs, int row) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

inline int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

// ---- Programmatic dependent launch (Hopper) ---------------------------------------------------
// A kernel launched with launch_pdl() may start while the kernel before it on the stream is still
// running: its blocks become resident beside the previous kernel's and can fetch what does not
// depend on it (the weights) before grid_dependency_wait(), which returns once the previous
// kernel has completed and its writes are visible. Every kernel so launched must call
// grid_dependency_wait() before it reads or writes activations.
// grid_dependency_wait() then lets the next kernel launch (griddepcontrol.launch_dependents), so at
// most two kernels of a chain overlap: the one computing and the next one fetching its weights.
// Triggering first thing instead (as before 2026-12-02) let a whole chain of waiting kernels
// become resident at once, each holding registers and issuing loads ahead of the one that runs.
// Kernels that never wait (plain launches: norm, embedding) call allow_dependents() first.
// Both are no-ops before sm_90 and for plain launches.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The wait alone, for a kernel that lets the next one launch later than its wait (it must then
// call allow_dependents() itself, or the next kernel launches when this one's blocks exit).
__device__ __forceinline__ void grid_dependency_wait_only() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
  grid_dependency_wait_only();
  allow_dependents();
}

// Launches `kernel` with programmatic stream serialization (see above) when `pdl`, otherwise as a
// plain launch.
template <typename... Params, typename... Args>
void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                   cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  XSERV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// launch_kernel with programmatic dependent launch when pdl_enabled().
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem,
                cudaStream_t stream, Args... args) {
  launch_kernel(pdl_enabled(), kernel, grid, block, smem, stream, args...);
}

}  // namespace xserv::cuda
