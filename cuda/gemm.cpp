#include "cuda/gemm.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "cuda/cuda_check.hpp"

namespace xserv::cuda {

namespace {
constexpr std::size_t workspace_bytes = 32u << 20;
// Tuning: the row buckets of batched decode (9..256 rows; prefill's larger buckets keep the
// heuristic, their GEMMs are compute-bound and would lengthen the load); replays per candidate
// (the median decides); at most this many weight copies per pass; how much faster than the
// heuristic's first a candidate must be; split-K variants: of how many of the best candidates,
// which splits, and only for weights up to twice the L2 cache (larger ones fill the GPU and
// stream at 3.7-4.2 TB/s under the heuristic's choice, docs/benchmarks.md).
constexpr std::int64_t tune_min_bucket = 16, tune_max_bucket = 256, tune_bucket_step = 32;
constexpr int tune_samples = 5;
constexpr std::size_t tune_max_copies = 8;
constexpr float min_gain = 0.03f;
constexpr std::size_t split_k_sources = 4;
constexpr std::uint32_t split_k_values[] = {2, 3, 4, 6, 8};

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

Gemm::Gemm(cudaStream_t stream, Allocator& workspace_allocator, GemmTuning tuning)
    : stream_(stream), workspace_(workspace_allocator, workspace_bytes), tune_config_(tuning) {
  XSERV_CUBLAS_CHECK(cublasLtCreate(&handle_));
  int device = 0, l2 = 0;
  XSERV_CUDA_CHECK(cudaGetDevice(&device));
  XSERV_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  l2_bytes_ = static_cast<std::size_t>(l2);
}

Gemm::~Gemm() {
  set_tuning(false);
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

void Gemm::set_tuning(bool on) {
  tuning_ = on;
  if (!on && scratch_) {
    (void)cudaFree(scratch_);  // waits for the timing launches that used it
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
}

// Above 8 rows: power-of-two buckets. A heuristic query costs about 3 ms and a prefill meets ~5
// weight shapes, so querying every new prompt length made an unseen length pay ~15 ms before its
// first token (issue 12); with buckets there are ~10 queries per shape for the life of the
// backend, and the warm-up at load makes them all. Tuned, the decode range goes per 32 rows: a
// GEMM of 72 or 160 rows ran its power-of-two bucket's algorithm up to 1.5x slower than that
// bucket's own, larger row count, and most ran 5-40% faster per 32 rows (docs/benchmarks.md,
// issue 10, "cuBLASLt algorithms by measurement").
std::int64_t Gemm::bucket_rows(std::int64_t m) const noexcept {
  if (m <= 8) return m;
  if (tune_config_.candidates >= 2 && m > tune_min_bucket && m <= tune_max_bucket)
    return (m + tune_bucket_step - 1) / tune_bucket_step * tune_bucket_step;
  std::int64_t b = 16;
  while (b < m) b *= 2;
  return b;
}

cublasLtMatrixLayout_t Gemm::activation_layout(cudaDataType_t type, std::int64_t k, std::int64_t m) {
  cublasLtMatrixLayout_t l = nullptr;
  XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k));
  return l;
}

Gemm::Plan& Gemm::plan(const Key& key, const void* a_data, const void* w_data, const void* bias_data) {
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

  // The algorithm: this shape's row bucket's (timed when tuning is on and this is the bucket's
  // own row count, else the heuristic's first), if it runs this exact shape
  // (cublasLtMatmulAlgoCheck, cheap); else the heuristic for the exact shape.
  Key bucket = key;
  std::get<3>(bucket) = bucket_rows(m);
  auto found = algos_.find(bucket);
  if (found == algos_.end()) {
    cublasLtMatmulAlgo_t algo{};
    if (m == std::get<3>(bucket) && tunable(bucket)) {
      algo = tune(*p, key, a_data, w_data, bias_data);
    } else {
      Plan probe;  // layouts of the bucket's M; the descriptor is shared
      probe.b = activation_layout(type, k, std::get<3>(bucket));
      XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&probe.c, out_type, static_cast<std::uint64_t>(n),
                                                    static_cast<std::uint64_t>(std::get<3>(bucket)), ldo));
      algo = heuristic(*p, p->a, probe.b, probe.c, {al_a, al_b, al_c}, key);
    }
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
  return candidates(p, a, b, c, alignment, key, 1).front();
}

std::vector<cublasLtMatmulAlgo_t> Gemm::candidates(const Plan& p, cublasLtMatrixLayout_t a,
                                                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                                   std::array<int, 3> alignment, const Key& key, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  XSERV_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t ws = workspace_bytes;
  const std::uint32_t align[4] = {static_cast<std::uint32_t>(alignment[0]), static_cast<std::uint32_t>(alignment[1]),
                                  static_cast<std::uint32_t>(alignment[2]), static_cast<std::uint32_t>(alignment[2])};
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(std::max(count, 1)));
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
    status = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, a, b, c, c, pref, static_cast<int>(results.size()),
                                            results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  XSERV_CUBLAS_CHECK(status);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) {
    const auto& r = results[static_cast<std::size_t>(i)];
    if (r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= workspace_bytes) algos.push_back(r.algo);
  }
  XSERV_CHECK(!algos.empty(), ErrorCode::unsupported,
              "gemm: cuBLASLt has no algorithm for {} M={} N={} K={} (ldo {}, bias {})",
              dtype_name(static_cast<DType>(std::get<0>(key))), std::get<3>(key), std::get<4>(key),
              std::get<5>(key), std::get<6>(key), std::get<7>(key));
  return algos;
}

bool Gemm::tunable(const Key& bucket) const {
  const std::int64_t rows = std::get<3>(bucket);
  if (!tuning_ || tune_config_.candidates < 2 || rows < tune_min_bucket || rows > tune_max_bucket) return false;
  // Timing needs events and a host wait, which a stream being captured into a graph forbids.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusActive;
  return cudaStreamIsCapturing(stream_, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone;
}

void Gemm::add_split_k_variants(const Plan& p, std::vector<cublasLtMatmulAlgo_t>& algos) {
  const std::size_t sources = std::min(algos.size(), split_k_sources);
  for (std::size_t i = 0; i < sources; ++i) {
    const cublasLtMatmulAlgo_t source = algos[i];
    std::int32_t support = 0;
    std::uint32_t schemes = 0;
    std::size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&source, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof(support),
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        support == 0 ||
        cublasLtMatmulAlgoCapGetAttribute(&source, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes),
                                          &written) != CUBLAS_STATUS_SUCCESS)
      continue;
    // A separate reduction in f32 (what the heuristic's own split-K choices use), else in place.
    const std::uint32_t compute = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, in_place = CUBLASLT_REDUCTION_SCHEME_INPLACE;
    const std::uint32_t scheme = (schemes & compute) ? compute : (schemes & in_place) ? in_place : 0u;
    if (scheme == 0) continue;
    for (std::uint32_t split : split_k_values) {
      cublasLtMatmulAlgo_t v = source;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.c, p.c, &v, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > workspace_bytes)
        continue;
      const bool seen = std::any_of(algos.begin(), algos.end(), [&](const cublasLtMatmulAlgo_t& a) {
        return std::memcmp(&a, &v, sizeof(v)) == 0;
      });
      if (!seen) algos.push_back(v);
    }
  }
}

float Gemm::time_pass(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* a,
                      const std::vector<const void*>& weights, void* out) {
  constexpr float never = std::numeric_limits<float>::infinity();
  const float alpha = 1.0f, beta = 0.0f;
  auto pass = [&] {
    for (const void* w : weights) {
      if (cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, a, p.b, &beta, out, p.c, out, p.c, &algo, workspace_.data(),
                         workspace_bytes, stream_) != CUBLAS_STATUS_SUCCESS)
        return false;
    }
    return true;
  };
  if (!pass()) return never;  // eager first: loads the kernel, outside the recording
  cudaGraph_t graph = nullptr;
  XSERV_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  const bool recorded = pass();
  const bool ended = cudaStreamEndCapture(stream_, &graph) == cudaSuccess;  // false: a call broke the capture
  cudaGraphExec_t exec = nullptr;
  const bool ready = recorded && ended && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (graph) (void)cudaGraphDestroy(graph);
  if (!ready) {
    (void)cudaGetLastError();
    return never;
  }
  std::array<cudaEvent_t, tune_samples + 1> events{};
  for (auto& e : events) XSERV_CUDA_CHECK(cudaEventCreate(&e));
  XSERV_CUDA_CHECK(cudaGraphLaunch(exec, stream_));  // warm: clocks up, the workspace touched
  for (int s = 0; s < tune_samples; ++s) {
    XSERV_CUDA_CHECK(cudaEventRecord(events[static_cast<std::size_t>(s)], stream_));
    XSERV_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  }
  XSERV_CUDA_CHECK(cudaEventRecord(events[tune_samples], stream_));
  XSERV_CUDA_CHECK(cudaEventSynchronize(events[tune_samples]));
  std::array<float, tune_samples> ms{};
  for (std::size_t s = 0; s < ms.size(); ++s) XSERV_CUDA_CHECK(cudaEventElapsedTime(&ms[s], events[s], events[s + 1]));
  for (auto e : events) (void)cudaEventDestroy(e);
  (void)cudaGraphExecDestroy(exec);
  std::nth_element(ms.begin(), ms.begin() + tune_samples / 2, ms.end());
  return ms[tune_samples / 2];
}

cublasLtMatmulAlgo_t Gemm::tune(const Plan& p, const Key& key, const void* a, const void* w, const void* bias) {
  const auto [dt_i, out_i, layout_i, m, n, k, ldo, has_bias, accumulate, al_a, al_b, al_c, al_bias] = key;
  (void)layout_i, (void)has_bias, (void)accumulate, (void)al_bias;
  std::vector<cublasLtMatmulAlgo_t> algos =
      candidates(p, p.a, p.b, p.c, {al_a, al_b, al_c}, key, tune_config_.candidates);

  // Scratch: copies of the weight (one pass over the live weight and them streams more than
  // twice the L2 cache, as a step over different layers' weights does), then the output.
  const std::size_t w_bytes = static_cast<std::size_t>(n * k) * dtype_size(static_cast<DType>(dt_i));
  if (tune_config_.split_k && w_bytes <= 2 * l2_bytes_) add_split_k_variants(p, algos);
  if (algos.size() == 1) return algos.front();
  const std::size_t w_stride = (w_bytes + 255) / 256 * 256;
  const std::size_t copies = std::clamp<std::size_t>((2 * l2_bytes_ + w_bytes - 1) / w_bytes, 1, tune_max_copies);
  const std::size_t out_bytes = static_cast<std::size_t>(m * ldo) * dtype_size(static_cast<DType>(out_i));
  const std::size_t need = (copies - 1) * w_stride + out_bytes;
  if (scratch_bytes_ < need) {
    if (scratch_) (void)cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    if (cudaMalloc(&scratch_, need) != cudaSuccess) {  // no room to measure: the heuristic's first
      (void)cudaGetLastError();
      scratch_ = nullptr;
      return algos.front();
    }
    scratch_bytes_ = need;
  }
  auto* base = static_cast<char*>(scratch_);
  std::vector<const void*> weights{w};
  for (std::size_t i = 1; i < copies; ++i) {
    void* copy = base + (i - 1) * w_stride;
    XSERV_CUDA_CHECK(cudaMemcpyAsync(copy, w, w_bytes, cudaMemcpyDeviceToDevice, stream_));
    weights.push_back(copy);
  }
  void* out = base + (copies - 1) * w_stride;
  if (bias)
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));

  const float first_ms = time_pass(p, algos.front(), a, weights, out);
  float best_ms = first_ms;
  std::size_t best = 0;
  for (std::size_t i = 1; i < algos.size(); ++i) {
    const float ms = time_pass(p, algos[i], a, weights, out);
    if (ms < best_ms) best_ms = ms, best = i;
  }
  if (best_ms == std::numeric_limits<float>::infinity()) return algos.front();
  ++tuned_;
  return best_ms < first_ms * (1.0f - min_gain) ? algos[best] : algos.front();
}

std::string Gemm::last_algorithm() const {
  if (!last_algo_) return {};
  // CUBLASLT_ALGO_CONFIG_* attributes in their enum order; the numbers are cublasLt.h's enums.
  const char* names[] = {"algo", "tile", "split-k", "reduction", "swizzle", "custom", "stages", "inner", "cluster"};
  std::string s;
  for (int attr = 0; attr < 9; ++attr) {
    const auto a = static_cast<cublasLtMatmulAlgoConfigAttributes_t>(attr);
    std::uint64_t v = 0;  // 2 to 4 bytes each; the rest stays 0 (little-endian)
    std::size_t size = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(last_algo_, a, nullptr, 0, &size) != CUBLAS_STATUS_SUCCESS ||
        size > sizeof(v) || cublasLtMatmulAlgoConfigGetAttribute(last_algo_, a, &v, size, &size) != CUBLAS_STATUS_SUCCESS)
      continue;
    char part[48];
    std::snprintf(part, sizeof(part), "%s%s %llu", s.empty() ? "" : " ", names[attr], static_cast<unsigned long long>(v));
    s += part;
  }
  return s;
}

void Gemm::run(DType dt, DType out_dt, void* out, std::int64_t ldo, const void* a, const void* w,
               WeightLayout layout, const void* bias, float beta, std::int64_t m, std::int64_t n,
               std::int64_t k) {
  if (m == 0 || n == 0) return;
  const Key key{static_cast<int>(dt), static_cast<int>(out_dt), static_cast<int>(layout), m, n, k, ldo, bias != nullptr,
                beta != 0.0f, alignment_of(w), alignment_of(a), alignment_of(out),
                bias ? alignment_of(bias) : 256};
  Plan& p = plan(key, a, w, bias);
  last_algo_ = &p.algo;
  if (bias)
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f;
  XSERV_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, a, p.b, &beta, out, p.c, out,
                                    p.c, &p.algo, workspace_.data(), workspace_bytes, stream_));
}

void Gemm::run_split_k(DType dt, float* partials, const void* a, const void* w, std::int64_t m, std::int64_t n,
                       std::int64_t k, int splits) {
  if (m == 0 || n == 0) return;
  XSERV_CHECK(splits >= 1 && k % (8 * splits) == 0, ErrorCode::invalid_argument,
              "gemm: K = {} does not split into {} parts of whole 16-byte pieces", k, splits);
  const SplitKey key{static_cast<int>(dt), m, n, k, splits, alignment_of(w), alignment_of(a)};
  auto it = split_plans_.find(key);
  if (it == split_plans_.end()) {
    const cudaDataType_t type = cuda_type(dt);
    const std::int64_t ks = k / splits;
    auto p = std::make_unique<Plan>();
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
    XSERV_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
    // As run(): out^T [N, M] = W_s . a_s^T; part s of W and a starts ks columns after part s - 1
    // (the same leading dimension K), part s of the output m * n floats after it.
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, type, static_cast<std::uint64_t>(ks), static_cast<std::uint64_t>(n), k));
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, type, static_cast<std::uint64_t>(ks), static_cast<std::uint64_t>(m), k));
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), n));
    const std::int32_t count = splits;
    const std::int64_t step = ks, out_step = m * n;
    for (cublasLtMatrixLayout_t l : {p->a, p->b}) {
      XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &step, sizeof(step)));
    }
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    XSERV_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &out_step, sizeof(out_step)));
    // The parts' alignment: the base's, capped by the part offset's (ks elements).
    const int part_align = alignment_of(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(ks * dtype_size(dt))));
    const Key probe_key{static_cast<int>(dt), static_cast<int>(DType::f32), static_cast<int>(WeightLayout::out_in), m, n,
                        ks, n, false, false, 0, 0, 0, 0};
    const auto algos = candidates(*p, p->a, p->b, p->c,
                                  {std::min(alignment_of(w), part_align), std::min(alignment_of(a), part_align), 256},
                                  probe_key, 8);
    p->algo = algos.front();
    for (const cublasLtMatmulAlgo_t& algo : algos) {  // the first without a reduce kernel
      std::uint32_t split = 1;
      std::size_t written = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split),
                                               &written) == CUBLAS_STATUS_SUCCESS &&
          split <= 1) {
        p->algo = algo;
        break;
      }
    }
    it = split_plans_.emplace(key, std::move(p)).first;
  }
  const Plan& p = *it->second;
  last_algo_ = &p.algo;
  const float alpha = 1.0f, beta = 0.0f;
  XSERV_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, a, p.b, &beta, partials, p.c, partials, p.c,
                                    &p.algo, workspace_.data(), workspace_bytes, stream_));
}

}  // namespace xserv::cuda
