// One decode row's whole SwiGLU MLP block as one kernel (Backend::rms_norm_mlp at one bf16 row):
//   x += (silu(g) * u) · W_down^T,   [g | u] = RMSNorm(x) · W_gate_up^T
// At batch 1 the MLP is two weight streams (gate|up, then down: two thirds of a Qwen3 layer's
// bytes) and as separate GEMVs each pays a ramp, a tail and a kernel boundary, which the small
// models cannot hide (Qwen3-1.7B's gate|up and down_proj stream at 3.0-3.4 TB/s where its lm_head
// reaches 4.4). Here the intermediate dimension is split instead of the output: a thread-block
// cluster of 8 blocks owns a slice of the intermediates, computes that slice of silu(g) * u, shares
// it through distributed shared memory, and multiplies it by the matching columns of W_down, so
// that each block's weight stream runs from its gate|up rows straight into its down_proj piece with
// no kernel boundary between them (the down_proj's loads are in flight while the gate|up's last
// products are summed). What remains is a sum of one f32 partial per cluster, which the last of a
// rank's blocks to finish adds in cluster order, with the residual, into x: deterministic.
//
// Layout: clusters c = 0 .. C-1 of ranks r = 0 .. 7; cluster c owns intermediates
// [c * S, (c + 1) * S) (S = I / C); rank r computes the gate|up rows of its eighth of them (and
// their silu(g) * u) and the down_proj partials of output rows [r * N/8, (r + 1) * N/8) over the
// cluster's S columns (contiguous S * 2 bytes a row). Each warp streams its rows through a ring of
// bulk copies (cp.async.bulk into shared memory, completion counted on an mbarrier a slot), as
// gemv.cu's gemv_bulk_kernel does: first its gate/up rows, then its down_proj row pieces.
// The roundings are the separate kernels' (RMSNorm rounded to bf16 before the weight, g and u
// rounded, silu rounded, the product rounded to bf16, x + the f32 sum rounded once); the sums run in
// another order, so the result is within the tolerance of the separate ops, not equal to them bit
// for bit.
#include <algorithm>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int warps = 8;
constexpr int cluster_size = 8;  // blocks a cluster: the portable limit
constexpr int chunk = 4096;      // bytes a ring slot
constexpr int default_stages = 3;  // slots a warp: 96 KB of weights in flight a block
constexpr int max_hidden = 8192;
constexpr int max_slice = 2048;  // intermediates a cluster: a down_proj row piece fits a slot
constexpr std::size_t ring_bytes(int stages) { return std::size_t{warps} * static_cast<std::size_t>(stages) * chunk; }

struct MlpArgs {
  bf16* x;  // [n] the residual, in and out
  const bf16* norm_w;
  float eps;
  const bf16* gate_up;  // [2 * inter, n]: gate rows, then up rows
  const bf16* down;     // [n, inter]
  float* partials;      // [clusters, n]
  unsigned* tickets;    // [cluster_size], zero before and after a launch
  int n, inter, slice;  // slice = inter / clusters
};

std::size_t smem_bytes(int n, int slice, int stages) {
  return ring_bytes(stages) + std::size_t{warps} * static_cast<std::size_t>(stages) * 8 + static_cast<std::size_t>(n) * 2 +
         static_cast<std::size_t>(slice) * 2 + static_cast<std::size_t>(slice / cluster_size) * 2;
}

// A dot product of `bytes` bf16 bytes (a multiple of 16) of a ring slot and of a row in shared
// memory, this lane's share (16 bytes every 512).
__device__ __forceinline__ float dot_lane(const unsigned char* w, const unsigned char* a, unsigned bytes, int lane) {
  float acc = 0.0f;
  for (unsigned b = lane * 16u; b < bytes; b += 32u * 16u) {
    float wf[8], af[8];
    load_f32<bf16, 8>(reinterpret_cast<const bf16*>(w + b), wf);
    load_f32<bf16, 8>(reinterpret_cast<const bf16*>(a + b), af);
#pragma unroll
    for (int v = 0; v < 8; ++v) acc += wf[v] * af[v];
  }
  return acc;
}

// ---- Clusters (sm_90): barriers over the cluster's threads, reads of a peer's shared memory -----
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}
// 16 bytes at `local` (this block's shared memory) of the cluster's block `rank`.
__device__ __forceinline__ uint4 load_peer16(const void* local, unsigned rank) {
  uint4 v = make_uint4(0, 0, 0, 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(local))), "r"(rank));
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(remote)
               : "memory");
#endif
  return v;
}

// A warp's share of one phase: `rows` weight rows of `row_bytes`, read as whole rows several to a
// slot (row_bytes <= chunk) or as chunk-sized pieces of a row.
struct Phase {
  int rows;
  unsigned row_bytes;
  int pieces;    // slots a row (1: whole rows)
  int per_slot;  // rows a slot (pieces == 1)
  __device__ int items() const { return pieces == 1 ? (rows + per_slot - 1) / per_slot : rows * pieces; }
};
__device__ __forceinline__ Phase make_phase(int rows, unsigned row_bytes) {
  Phase p{rows, row_bytes, 1, 1};
  if (row_bytes > static_cast<unsigned>(chunk)) p.pieces = static_cast<int>((row_bytes + chunk - 1) / chunk);
  else p.per_slot = min(rows, chunk / static_cast<int>(row_bytes));
  return p;
}

template <int stages>
__global__ void __launch_bounds__(warps * 32, 1) mlp_kernel(const MlpArgs p) {
  extern __shared__ __align__(128) unsigned char s_mlp[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cluster = blockIdx.x / cluster_size, rank = blockIdx.x % cluster_size;
  const int n = p.n, inter = p.inter, slice = p.slice;
  unsigned char* ring = s_mlp + static_cast<std::size_t>(warp) * stages * chunk;
  auto* bars = reinterpret_cast<std::uint64_t*>(s_mlp + ring_bytes(stages)) + warp * stages;
  auto* s_xn = reinterpret_cast<bf16*>(s_mlp + ring_bytes(stages) + warps * stages * 8);  // RMSNorm(x) * g [n]
  bf16* s_h = s_xn + n;             // the cluster's silu(g) * u [slice]
  bf16* s_own = s_h + slice;        // this block's eighth of it [slice / 8], read by its peers
  __shared__ float s_red[warps];
  __shared__ bool s_last;

  // This warp's rows. Gate|up: pairs j of the block's eighth of the slice, gate row then up row.
  const int pairs = slice / (cluster_size * warps);
  const int j0 = cluster * slice + rank * (slice / cluster_size) + warp * pairs;
  const Phase pa = make_phase(2 * pairs, static_cast<unsigned>(n) * 2u);
  // Down_proj: output rows of the block's eighth of n, the cluster's slice of columns.
  const int out_rows = n / (cluster_size * warps);
  const int o0 = rank * (n / cluster_size) + warp * out_rows;
  const Phase pb = make_phase(out_rows, static_cast<unsigned>(slice) * 2u);
  const int items_a = pa.items(), items = items_a + pb.items();
  const auto* gu = reinterpret_cast<const unsigned char*>(p.gate_up);
  const auto* dn = reinterpret_cast<const unsigned char*>(p.down);
  // Item i into slot i % stages (lane 0): the rows (or the piece of a row) it holds, one bulk copy
  // each, their bytes announced on the slot's barrier first.
  auto row_src = [&](int phase_b, int q) -> const unsigned char* {
    if (phase_b) return dn + (static_cast<std::int64_t>(o0 + q) * inter + static_cast<std::int64_t>(cluster) * slice) * 2;
    const int row = (q & 1) * inter + j0 + (q >> 1);
    return gu + static_cast<std::int64_t>(row) * n * 2;
  };
  auto issue = [&](int i) {
    const int phase_b = i >= items_a;
    const Phase ph = phase_b ? pb : pa;
    const int it = phase_b ? i - items_a : i;
    unsigned char* dst = ring + (i % stages) * chunk;
    std::uint64_t* bar = &bars[i % stages];
    if (ph.pieces > 1) {
      const unsigned off = static_cast<unsigned>(it % ph.pieces) * chunk;
      bulk_load(dst, row_src(phase_b, it / ph.pieces) + off, min(static_cast<unsigned>(chunk), ph.row_bytes - off), bar);
      return;
    }
    const int q0 = it * ph.per_slot, nq = min(ph.per_slot, ph.rows - q0);
    mbar_expect_tx(bar, static_cast<unsigned>(nq) * ph.row_bytes);
    for (int t = 0; t < nq; ++t) bulk_copy(dst + t * ph.row_bytes, row_src(phase_b, q0 + t), ph.row_bytes, bar);
  };
  if (lane == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(&bars[s]);
    mbar_init_fence();
    // The weights do not depend on the kernel before: the ring fills before the wait.
    for (int i = 0; i < min(items, stages); ++i) issue(i);
  }
  __syncwarp();
  grid_dependency_wait();

  // RMSNorm(x) * g into shared memory, rounded as the norm kernel rounds (x * rstd to bf16 first).
  float ss = 0.0f;
  for (int i = threadIdx.x * 8; i < n; i += blockDim.x * 8) {
    float v[8];
    load_f32<bf16, 8>(p.x + i, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  }
  ss = warp_sum(ss);
  if (lane == 0) s_red[warp] = ss;
  __syncthreads();
  ss = 0.0f;
#pragma unroll
  for (int w8 = 0; w8 < warps; ++w8) ss += s_red[w8];
  const float rstd = rsqrtf(ss / static_cast<float>(n) + p.eps);
  for (int i = threadIdx.x * 8; i < n; i += blockDim.x * 8) {
    float v[8], g[8], o[8];
    load_f32<bf16, 8>(p.x + i, v);
    load_f32<bf16, 8>(p.norm_w + i, g);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = __bfloat162float(__float2bfloat16_rn(v[e] * rstd)) * g[e];
    store_f32<bf16, 8>(s_xn + i, o);
  }
  __syncthreads();

  float acc = 0.0f, gate = 0.0f;
  for (int i = 0; i < items; ++i) {
    if (i == items_a) {
      // Every block of the cluster has its eighth of silu(g) * u: gather the slice, 16 bytes a
      // thread. The second arrival says this block is done reading its peers; its wait comes
      // last, so that no block leaves while a peer may still read its s_own.
      cluster_arrive();
      cluster_wait();
      const int vecs = slice / 8, per_rank = vecs / cluster_size;
      for (int v = threadIdx.x; v < vecs; v += blockDim.x)
        reinterpret_cast<uint4*>(s_h)[v] = load_peer16(reinterpret_cast<const uint4*>(s_own) + v % per_rank,
                                                       static_cast<unsigned>(v / per_rank));
      __syncthreads();
      cluster_arrive();
    }
    const int slot = i % stages;
    mbar_wait(&bars[slot], static_cast<unsigned>(i / stages) & 1u);
    const unsigned char* w = ring + slot * chunk;
    const int phase_b = i >= items_a;
    const Phase ph = phase_b ? pb : pa;
    const int it = phase_b ? i - items_a : i;
    const auto* act = reinterpret_cast<const unsigned char*>(phase_b ? s_h : s_xn);
    // Row q of the phase is complete with this lane's share `part` of its sum.
    auto emit = [&](int q, float part) {
      const float sum = warp_sum(part);
      if (lane != 0) return;
      if (phase_b) {
        p.partials[static_cast<std::int64_t>(cluster) * n + o0 + q] = sum;
      } else if ((q & 1) == 0) {
        gate = sum;
      } else {  // the swiglu kernel's roundings
        const float g = __bfloat162float(__float2bfloat16_rn(gate)), u = __bfloat162float(__float2bfloat16_rn(sum));
        const float sg = __bfloat162float(__float2bfloat16_rn(g / (1.0f + expf(-g))));
        s_own[warp * pairs + (q >> 1)] = __float2bfloat16_rn(sg * u);
      }
    };
    if (ph.pieces > 1) {
      const unsigned off = static_cast<unsigned>(it % ph.pieces) * chunk;
      acc += dot_lane(w, act + off, min(static_cast<unsigned>(chunk), ph.row_bytes - off), lane);
      if (it % ph.pieces == ph.pieces - 1) {
        emit(it / ph.pieces, acc);
        acc = 0.0f;
      }
    } else {
      const int q0 = it * ph.per_slot, nq = min(ph.per_slot, ph.rows - q0);
      for (int t = 0; t < nq; ++t) emit(q0 + t, dot_lane(w + t * ph.row_bytes, act, ph.row_bytes, lane));
    }
    __syncwarp();  // every lane is done with the slot before it is refilled
    if (lane == 0 && i + stages < items) issue(i + stages);
  }

  // The cluster partials of this rank's rows: the last of the rank's blocks to finish adds them in
  // cluster order, and the residual, into x (every block has read x: its cluster's barrier came
  // after its norm). The ticket is left at zero for the next launch.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(&p.tickets[rank], 1u) == gridDim.x / cluster_size - 1;
  __syncthreads();
  if (s_last) {
    __threadfence();
    const int clusters = gridDim.x / cluster_size, rows = n / cluster_size;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
      const int row = rank * rows + r;
      float s = 0.0f;
      for (int c = 0; c < clusters; ++c) s += __ldcg(p.partials + static_cast<std::int64_t>(c) * n + row);
      p.x[row] = __float2bfloat16_rn(__bfloat162float(p.x[row]) + s);
    }
    if (threadIdx.x == 0) p.tickets[rank] = 0;
  }
  cluster_wait();
}

// Clusters for a shape on `sm_count` SMs: the most up to one block an SM (whole clusters) whose
// slice divides the intermediates into whole warps' pairs and fits a slot; 0 when even the best
// leaves a quarter of the SMs idle (the separate kernels then stream faster).
int clusters_for(int sm_count, std::int64_t n, std::int64_t inter) {
  if (n <= 0 || inter <= 0 || n > max_hidden || n % (cluster_size * warps) != 0) return 0;
  for (int c = sm_count / cluster_size; c > 0 && c * cluster_size * 4 >= sm_count * 3; --c) {
    if (inter % c != 0) continue;
    const std::int64_t slice = inter / c;
    if (slice % (cluster_size * warps) == 0 && slice <= max_slice) return c;
  }
  return 0;
}

// The kernel of a ring depth (2-4 slots a warp; others take the default).
auto kernel_for(int stages) {
  return stages == 2 ? mlp_kernel<2> : stages == 4 ? mlp_kernel<4> : mlp_kernel<default_stages>;
}

// Whether the kernel can run on the current device: built for sm_90 or later (below that its
// clusters, bulk copies and barriers compile to nothing) and its shared memory configured for the
// largest shape at every ring depth. A failure is not an error: the separate GEMVs run instead.
// Once a process (it drives devices of one kind).
bool kernel_usable() {
  static const bool usable = [] {
    cudaFuncAttributes attr{};
    bool ok = cudaFuncGetAttributes(&attr, kernel_for(default_stages)) == cudaSuccess && attr.binaryVersion >= 90;
    for (int st = 2; ok && st <= 4; ++st)
      ok = cudaFuncSetAttribute(kernel_for(st), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem_bytes(max_hidden, max_slice, st))) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
    return ok;
  }();
  return usable;
}

}  // namespace

bool mlp_fused_supported(DType dt, std::int64_t rows, std::int64_t n, std::int64_t inter, const void* x,
                         const void* gate_up, const void* down, int sm_count) noexcept {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return dt == DType::bf16 && rows == 1 && clusters_for(sm_count, n, inter) > 0 && aligned(x) && aligned(gate_up) &&
         aligned(down) && kernel_usable();
}

std::size_t mlp_fused_partial_floats(std::int64_t n, std::int64_t inter, int sm_count) noexcept {
  return static_cast<std::size_t>(clusters_for(sm_count, n, inter)) * static_cast<std::size_t>(n);
}

void launch_mlp_fused(cudaStream_t stream, void* x, const void* norm_w, float eps, const void* gate_up,
                      const void* down, std::int64_t n, std::int64_t inter, float* partials, unsigned* tickets,
                      int sm_count, int stages) {
  const int clusters = clusters_for(sm_count, n, inter);
  const MlpArgs args{static_cast<bf16*>(x), static_cast<const bf16*>(norm_w), eps,
                     static_cast<const bf16*>(gate_up), static_cast<const bf16*>(down), partials, tickets,
                     static_cast<int>(n), static_cast<int>(inter), static_cast<int>(inter / clusters)};
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(clusters * cluster_size);
  config.blockDim = dim3(warps * 32);
  stages = stages >= 2 && stages <= 4 ? stages : default_stages;  // as kernel_for
  config.dynamicSmemBytes = smem_bytes(args.n, args.slice, stages);
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = cluster_size;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl_enabled() ? 2 : 1;
  XSERV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel_for(stages), args));
}

}  // namespace xserv::cuda
