#include "cuda/gemm.hpp"

#include "cuda/cuda_check.hpp"

namespace xserv::cuda {

namespace {
constexpr std::size_t workspace_bytes = 32u << 20;

cudaDataType_t cuda_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: throw_error(ErrorCode::invalid_argument, "gemm: dtype {} is not a float type", dtype_name(dt));
  }
}

// Largest power of two (up to 256) dividing the address: cuBLASLt assumes 256-byte aligned
// operands unless told otherwise, and column slices of a packed activation are not.
int alignment_of(const void* p) {
  auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % static_cast<std::uintptr_t>(a)) != 0) a /= 2;
  return a;
}
}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Gemm::Gemm(cudaStream_t stream, Allocator& workspace_allocator)
    : stream_(stream), workspace_(workspace_allocator, workspace_bytes) {
  XSERV_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

namespace {
// The M whose heuristic a GEMM of M rows uses: M itself up to 8 rows (decode batches, where the
// choice matters most and few sizes occur), then the next power of two. A heuristic query costs
// about 3 ms and a prefill meets ~5 weight shapes, so querying every new prompt length made an
// unseen length pay ~15 ms before its first token (issue 12); with buckets there are ~10 queries
// per shape for the life of the backend, and a warm-up at load can make them all.
std::int64_t heuristic_rows(std::int64_t m) noexcept {
  if (m <= 8) return m;
  std::int64_t b = 16;
  while (b < m) b *= 2;
  return b;
}
}  // namespace

cublasLtMatrixLayout_t Gemm::activation_layout(cudaDataType_t type, std::int64_t k, std::int64_t m) {
  cublasLtMatrixLayout_t l = nullptr;
  XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k));
  return l;
}

Gemm::Plan& Gemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [dt_i, out_i, layout_i, m, n, k, ldo, has_bias, accumulate, al_a, al_b, al_c, al_bias] = key;
  (void)accumulate, (void)al_bias;
  const DType dt = static_cast<DType>(dt_i);
  const auto layout = static_cast<WeightLayout>(layout_i);
  const cudaDataType_t type = cuda_type(dt);
  const cudaDataType_t out_type = cuda_type(static_cast<DType>(out_i));
  auto p = std::make_unique<Plan>();

  // Row-major out[M, N] is column-major out^T [N, M]; so the product is computed as
  // out^T = op(W) . a^T with the weight as cuBLASLt's A and the activation as its B.
  XSERV_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = layout == WeightLayout::out_in ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (has_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
  }
  if (layout == WeightLayout::out_in) {  // W [N, K] row-major = [K, N] column-major, ld K
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k));
  } else {  // W [K, N] row-major = [N, K] column-major, ld N
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(k), n));
  }
  p->b = activation_layout(type, k, m);
  XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, out_type, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), ldo));

  // The algorithm: the heuristic's choice for this shape's row bucket, if it runs this exact
  // shape (cublasLtMatmulAlgoCheck, cheap); else the heuristic for the exact shape.
  Key bucket = key;
  std::get<3>(bucket) = heuristic_rows(m);
  auto found = algos_.find(bucket);
  if (found == algos_.end()) {
    Plan probe;  // layouts of the bucket's M; the descriptor is shared
    probe.b = activation_layout(type, k, std::get<3>(bucket));
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&probe.c, out_type, static_cast<std::uint64_t>(n),
                                                  static_cast<std::uint64_t>(std::get<3>(bucket)), ldo));
    const cublasLtMatmulAlgo_t algo = heuristic(*p, p->a, probe.b, probe.c, {al_a, al_b, al_c}, key);
    found = algos_.emplace(bucket, algo).first;
  }
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(handle_, p->desc, p->a, p->b, p->c, p->c, &found->second, &check) ==
          CUBLAS_STATUS_SUCCESS &&
      check.workspaceSize <= workspace_bytes) {
    p->algo = found->second;
  } else {
    p->algo = heuristic(*p, p->a, p->b, p->c, {al_a, al_b, al_c}, key);
  }
  return *plans_.emplace(key, std::move(p)).first->second;
}

cublasLtMatmulAlgo_t Gemm::heuristic(const Plan& p, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                     cublasLtMatrixLayout_t c, std::array<int, 3> alignment, const Key& key) {
  cublasLtMatmulPreference_t pref = nullptr;
  XSERV_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = workspace_bytes;
  const std::uint32_t align[4] = {static_cast<std::uint32_t>(alignment[0]), static_cast<std::uint32_t>(alignment[1]),
                                  static_cast<std::uint32_t>(alignment[2]), static_cast<std::uint32_t>(alignment[2])};
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof(std::uint32_t));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof(std::uint32_t));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof(std::uint32_t));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[3], sizeof(std::uint32_t));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, a, b, c, c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  XSERV_CUBLAS_CHECK(status);
  XSERV_CHECK(found > 0, ErrorCode::unsupported,
              "gemm: cuBLASLt has no algorithm for {} M={} N={} K={} (ldo {}, bias {})",
              dtype_name(static_cast<DType>(std::get<0>(key))), std::get<3>(key), std::get<4>(key),
              std::get<5>(key), std::get<6>(key), std::get<7>(key));
  return result.algo;
}

void Gemm::run(DType dt, DType out_dt, void* out, std::int64_t ldo, const void* a, const void* w,
               WeightLayout layout, const void* bias, float beta, std::int64_t m, std::int64_t n,
               std::int64_t k) {
  if (m == 0 || n == 0) return;
  const Key key{static_cast<int>(dt), static_cast<int>(out_dt), static_cast<int>(layout), m, n, k, ldo, bias != nullptr,
                beta != 0.0f, alignment_of(w), alignment_of(a), alignment_of(out),
                bias ? alignment_of(bias) : 256};
  Plan& p = plan(key);
  if (bias)
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f;
  XSERV_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, a, p.b, &beta, out, p.c, out,
                                    p.c, &p.algo, workspace_.data(), workspace_bytes, stream_));
}

}  // namespace xserv::cuda
