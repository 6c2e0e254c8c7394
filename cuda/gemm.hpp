// GEMMs through cuBLASLt: one handle and one workspace for the backend's life, matmul plans
// (descriptors and layouts) cached per shape and one algorithm per row bucket (see
// heuristic_rows), so a decode step pays no setup and a new prompt length no heuristic query.
// bf16/f16 on tensor cores with f32 accumulation; f32 with plain f32 compute (no TF32) for GPT-2
// parity. Bias rides the BIAS epilogue, a residual add is beta = 1 on C = D.
//
// The algorithm of a row bucket is the heuristic's first, or, for the buckets of batched decode
// (9..256 rows) met while tuning is on (the model's load-time warm-up), the fastest of the
// heuristic's first `tune_candidates` by measurement: each candidate runs on the live input and
// weight (read only) into a scratch output with beta = 0, cycling over copies of the weight that
// together exceed the L2 cache (a decode step streams every layer's weight from DRAM), and the
// median of a few timed passes decides. Never during CUDA graph capture (cudaStreamIsCapturing):
// there, and for buckets met first after the warm-up, the heuristic's first is taken as before.
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

// How many of the heuristic's algorithms the CUDA backend times per batched-decode row bucket
// (XSERV_CUDA_GEMM_TUNE overrides; 0 or 1: no tuning).
constexpr int default_gemm_tune_candidates = 16;

class Gemm {
 public:
  // tune_candidates: how many of the heuristic's algorithms tuning times (0: tuning never runs).
  Gemm(cudaStream_t stream, Allocator& workspace_allocator, int tune_candidates = 0);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out[M, N] (rows ldo apart) = a[M, K] . W + bias + beta * out; a, W and bias in `dt`, out in
  // `out_dt` (dt, or f32 for logits).
  void run(DType dt, DType out_dt, void* out, std::int64_t ldo, const void* a, const void* w, WeightLayout layout,
           const void* bias, float beta, std::int64_t m, std::int64_t n, std::int64_t k);

  // While on, the algorithm of a tunable row bucket first met at exactly its bucket's row count
  // (outside graph capture) is chosen by timing; off frees the tuning scratch. The model's
  // warm-up turns it on (Backend::set_warming_up), so no request pays for the measurements.
  void set_tuning(bool on);
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
  // The fastest candidate on this exact shape (see the file comment); the heuristic's first
  // when none could be timed (no scratch memory).
  cublasLtMatmulAlgo_t tune(const Plan& p, const Key& key, const void* a, const void* w, const void* bias);
  bool tunable(const Key& bucket) const;

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // per exact shape
  std::map<Key, cublasLtMatmulAlgo_t> algos_;   // the choice per row bucket
  int tune_candidates_;
  bool tuning_ = false;
  std::size_t tuned_ = 0;
  void* scratch_ = nullptr;  // tuning only: weight copies and the output (cudaMalloc, grows)
  std::size_t scratch_bytes_ = 0;
  std::size_t l2_bytes_ = 0;
  const cublasLtMatmulAlgo_t* last_algo_ = nullptr;  // in a plan of plans_ (never erased)
};

}  // namespace xserv::cuda
