// GEMMs through cuBLASLt: one handle and one workspace for the backend's life, matmul plans
// (descriptors and layouts) cached per shape and the heuristic's algorithm per row bucket (see
// heuristic_rows), so a decode step pays no setup and a new prompt length no heuristic query. bf16/f16 on tensor cores with f32 accumulation; f32 with plain f32 compute (no TF32)
// for GPT-2 parity. Bias rides the BIAS epilogue, a residual add is beta = 1 on C = D.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/backend.hpp"

namespace xserv::cuda {

class Gemm {
 public:
  Gemm(cudaStream_t stream, Allocator& workspace_allocator);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out[M, N] (rows ldo apart) = a[M, K] . W + bias + beta * out; a, W and bias in `dt`, out in
  // `out_dt` (dt, or f32 for logits).
  void run(DType dt, DType out_dt, void* out, std::int64_t ldo, const void* a, const void* w, WeightLayout layout,
           const void* bias, float beta, std::int64_t m, std::int64_t n, std::int64_t k);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool,
                         bool, int, int, int, int>;
  Plan& plan(const Key& key);
  static cublasLtMatrixLayout_t activation_layout(cudaDataType_t type, std::int64_t k, std::int64_t m);
  cublasLtMatmulAlgo_t heuristic(const Plan& p, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                 cublasLtMatrixLayout_t c, std::array<int, 3> alignment, const Key& key);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;  // per exact shape
  std::map<Key, cublasLtMatmulAlgo_t> algos_;   // the heuristic's choice per row bucket
};

}  // namespace xserv::cuda
