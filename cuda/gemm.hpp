// GEMMs through cuBLASLt: one handle and one workspace for the backend's life, matmul plans
// (descriptors and layouts) cached per shape and one algorithm per row bucket (bucket_rows), so a
// decode step pays no setup and a new prompt length no heuristic query. bf16/f16 on tensor cores
// with f32 accumulation; f32 with plain f32 compute (no TF32) for GPT-2 parity. Bias rides the
// BIAS epilogue, a residual add is beta = 1 on C = D.
//
// The algorithm of a row bucket is the heuristic's first or, with tuning (GemmTuning), for the
// buckets of batched decode (9..256 rows, per 32 rows above 16) met while tuning is on (the
// model's load-time warm-up), the fastest by measurement of the heuristic's first candidates and
// split-K variants of its best few (the heuristic seldom offers them for the small memory-bound
// layer GEMMs of decode, whose tiles leave SMs idle). Each candidate runs on the live input and
// weight (read only) into a scratch output with beta = 0, cycling over copies of the weight that
// together exceed twice the L2 cache (a decode step streams every layer's weight from DRAM),
// recorded into a CUDA graph (as a decode step replays it: launch overhead would otherwise
// decide between the few-microsecond kernels), and the median of a few replays decides; a
// candidate replaces the heuristic's first only when it is clearly faster (min_gain), so noise
// does not change the algorithm (and the rounding) from one load to the next. Never during CUDA
// graph capture (cudaStreamIsCapturing): there, and for buckets met first after the warm-up, the
// heuristic's first is taken as before.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"

namespace xserv::cuda {

// Measured algorithm choice (see the file comment). candidates < 2: none, the heuristic's first
// everywhere with power-of-two row buckets above 8 (as before 2026-12-02).
struct GemmTuning {
  int candidates = 0;   // the heuristic's first this many are timed
  bool split_k = true;  // and split-K variants of its best few
};
// The CUDA backend's: off. Measured on the H200 (docs/benchmarks.md, issue 10, "cuBLASLt
// algorithms by measurement"): at the 64 and 128 rows of serving 64 / 128 requests at once the
// heuristic's first is within ~5% of the best of its first 16 and their split-K variants, so
// serving Qwen3-1.7B / 8B did not get faster (within run-to-run noise) while the load took 1.5 /
// 3.3 s longer; most GEMMs of rows between powers of two (72..192) ran 5-40% faster.
// XSERV_CUDA_GEMM_TUNE=N turns it on with N candidates, XSERV_CUDA_GEMM_TUNE_SPLITK=0 leaves
// the split-K variants out.
constexpr GemmTuning default_gemm_tuning{0, true};

class Gemm {
 public:
  Gemm(cudaStream_t stream, Allocator& workspace_allocator, GemmTuning tuning = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out[M, N] (rows ldo apart) = a[M, K] . W + bias + beta * out; a, W and bias in `dt`, out in
  // `out_dt` (dt, or f32 for logits).
  void run(DType dt, DType out_dt, void* out, std::int64_t ldo, const void* a, const void* w, WeightLayout layout,
           const void* bias, float beta, std::int64_t m, std::int64_t n, std::int64_t k);

  // K split in `splits` equal parts as one strided-batched product without any reduction:
  //   partials[s][M, N] (f32, contiguous) = a[:, s K/S : (s+1) K/S] . W[:, s K/S : (s+1) K/S]^T
  // with a [M, K] and W out_in [N, K] in dt (bf16/f16). The caller sums the parts (with the
  // residual and the next RMSNorm: launch_residual_rms_norm). K % (8 splits) == 0. The algorithm
  // is the heuristic's first without a split-K of its own (no reduce kernel), else its first.
  void run_split_k(DType dt, float* partials, const void* a, const void* w, std::int64_t m, std::int64_t n,
                   std::int64_t k, int splits);

  // While on, the algorithm of a tunable row bucket first met at exactly its bucket's row count
  // (outside graph capture) is chosen by timing; off frees the tuning scratch. The model's
  // warm-up turns it on (Backend::set_warming_up), so no request pays for the measurements.
  void set_tuning(bool on);
  // The row count whose algorithm a GEMM of m rows uses: m itself up to 8 rows, then the next
  // power of two, except 17..256 rows, which go per 32 rows when tuning is configured. The
  // warm-up's forwards meet every tuned bucket at its own row count.
  std::int64_t bucket_rows(std::int64_t m) const noexcept;
  // Row buckets whose algorithm was chosen by timing so far (tests and benchmarks).
  std::size_t tuned_buckets() const noexcept { return tuned_; }
  // The last run's algorithm as cuBLASLt describes it ("algo 66 tile 17 stages 21 split-k 1
  // ..."), for benchmarks; empty when the last GEMM was empty.
  std::string last_algorithm() const;

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,
                         bool, int, int, int, int>;
  Plan& plan(const Key& key, const void* a, const void* w, const void* bias);
  static cublasLtMatrixLayout_t activation_layout(cudaDataType_t type, std::int64_t k, std::int64_t m);
  cublasLtMatmulAlgo_t heuristic(const Plan& p, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                 cublasLtMatrixLayout_t c, std::array<int, 3> alignment, const Key& key);
  // The heuristic's first `count` algorithms that fit the workspace, best first (none: throws).
  std::vector<cublasLtMatmulAlgo_t> candidates(const Plan& p, cublasLtMatrixLayout_t a,
                                               cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                               std::array<int, 3> alignment, const Key& key, int count);
  // Split-K variants of the first few algorithms that this shape runs, appended.
  void add_split_k_variants(const Plan& p, std::vector<cublasLtMatmulAlgo_t>& algos);
  // The fastest candidate on this exact shape (see the file comment); the heuristic's first
  // when none could be timed (no scratch memory).
  cublasLtMatmulAlgo_t tune(const Plan& p, const Key& key, const void* a, const void* w, const void* bias);
  // Median milliseconds of one pass over `weights` with `algo` (graph replays); infinity when
  // the algorithm does not launch.
  float time_pass(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* a,
                  const std::vector<const void*>& weights, void* out);
  bool tunable(const Key& bucket) const;

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // per exact shape
  std::map<Key, cublasLtMatmulAlgo_t> algos_;   // the choice per row bucket
  // run_split_k's plans per (dtype, M, N, K, splits, alignment of a and W).
  using SplitKey = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, int, int, int>;
  std::map<SplitKey, std::unique_ptr<Plan>> split_plans_;
  GemmTuning tune_config_;
  bool tuning_ = false;
  std::size_t tuned_ = 0;
  void* scratch_ = nullptr;  // tuning only: weight copies and the output (cudaMalloc, grows)
  std::size_t scratch_bytes_ = 0;
  std::size_t l2_bytes_ = 0;
  const cublasLtMatmulAlgo_t* last_algo_ = nullptr;  // in a plan of plans_ (never erased)
};

}  // namespace xserv::cuda
