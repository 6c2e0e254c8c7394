// CudaBackend: the Backend ops on one NVIDIA GPU.
//
// Design (what the rest of xserv can rely on):
// - One stream for every op. Ops enqueue and return; only download(), sample() and
//   synchronize() wait, and sample() waits only for the R sampled ids. An overlapped step's
//   sampling copies (sample_async) take a second stream, ordered by events (enqueue_sample).
// - upload_decode_batch keeps a decode batch on the device while each step is the last one one
//   token further: no copy, prepare_decode (the recording's first kernel) advances it.
// - Memory comes from DeviceArenas (few large cudaMallocs): one for weights (bump, 1 GiB chunks),
//   one behind allocator() for KV pools, activation workspaces and the backend's own scratch.
//   Never managed memory.
// - Weights are copied from the mmap'd checkpoint through a ring of pinned staging buffers: the
//   host copy of chunk i+1 (several threads) overlaps the DMA of chunk i. f16 weights become
//   bf16 on the device (activations of 16-bit models are bf16, and every kernel reads weights in
//   the activation dtype).
// - upload_batch writes into fixed device buffers (addresses change only when a batch outgrows
//   them), so a recorded CUDA graph of a decode step stays valid; block tables are re-strided to
//   a power of two (DeviceBatch::max_blocks_per_seq says which) so the stride seldom changes.
// - run_graph: the first call with a key runs the ops eagerly (kernels load, GEMM plans and
//   scratch settle), the second records them into a CUDA graph, later calls replay it. The key
//   is combined with the last upload_batch's shape, including the power-of-two bucket of the
//   longest context that sizes split-KV decode.
#include "cuda/cuda_backend.hpp"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "core/thread_pool.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

constexpr std::size_t weight_chunk_bytes = std::size_t{1} << 30;
constexpr std::size_t work_chunk_bytes = std::size_t{256} << 20;
constexpr std::size_t staging_bytes = std::size_t{64} << 20;
constexpr int staging_count = 3;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Page-locked host memory: the only kind the copy engines read asynchronously.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
    XSERV_CUDA_CHECK(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault));
  }
  ~PinnedBuffer() {
    if (data_) (void)cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  char* data() const noexcept { return static_cast<char*>(data_); }
  std::size_t size() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Where each array of a ForwardBatch lives inside the fixed batch buffers (in int32 elements).
// token_src keeps the host's token ids (placeholders included) for prepare_decode, which
// resolves them into `tokens` again every step; control holds prepare_decode's state
// (launch_prepare_decode).
struct BatchLayout {
  std::int64_t cap_tokens = 0, cap_seqs = 0, cap_table = 0;
  std::int64_t tokens = 0, token_src = 0, positions = 0, slots = 0, query_start = 0,
               context_lens = 0, logit_rows = 0, control = 0, block_tables = 0, total = 0;
  static BatchLayout make(std::int64_t t, std::int64_t s, std::int64_t table) {
    BatchLayout l;
    l.cap_tokens = t;
    l.cap_seqs = s;
    l.cap_table = table;
    std::int64_t off = 0;
    auto take = [&](std::int64_t n) {
      const std::int64_t at = off;
      off += (n + 63) / 64 * 64;  // 256-byte aligned sections
      return at;
    };
    l.tokens = take(t);
    l.token_src = take(t);
    l.positions = take(t);
    l.slots = take(t);
    l.logit_rows = take(t);
    l.query_start = take(s + 1);
    l.context_lens = take(s);
    l.control = take(2);
    l.block_tables = take(table);
    l.total = off;
    return l;
  }
};

std::int32_t next_pow2(std::int32_t v) {
  return v <= 1 ? 1 : static_cast<std::int32_t>(std::bit_ceil(static_cast<std::uint32_t>(v)));
}

bool is_act(DType t) { return t == DType::f32 || t == DType::bf16; }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  Device device() const noexcept override { return {DeviceKind::cuda, device_index_}; }
  std::string name() const override { return name_; }
  DType activation_dtype(DType weights) const noexcept override {
    return weights == DType::f32 ? DType::f32 : DType::bf16;
  }

  Allocator& allocator() noexcept override { return work_; }
  Tensor import_weight(const Tensor& host) override;
  void reserve_adjacent_weights(std::span<const std::size_t> bytes) override {
    if (adjacent_weights_) weights_.reserve_adjacent(bytes.data(), bytes.size());
  }
  void upload(Tensor dst, const void* host_src) override;
  void download(void* host_dst, const Tensor& src) override;
  void fill_zero(Tensor dst) override;
  void copy(Tensor dst, const Tensor& src) override;
  void transpose(Tensor dst, const Tensor& src) override;
  MemoryInfo memory_info() const override;
  DeviceBatch upload_batch(const ForwardBatch& batch) override;
  DeviceBatch upload_decode_batch(const ForwardBatch& batch, std::int32_t growing) override;
  void prepare_decode(const DeviceBatch& batch, const Tensor& sampled) override;
  bool keeps_decode_batches() const noexcept override { return keep_decode_batches_; }
  void synchronize() override {
    XSERV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (copy_stream_) XSERV_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    close_profile_range();
  }
  void bind_thread() override { XSERV_CUDA_CHECK(cudaSetDevice(device_index_)); }
  void* native_stream() noexcept override { return stream_; }
  void set_warming_up(bool on) override { gemm_->set_tuning(on); }

  void embedding(Tensor out, const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                 const Tensor& positions) override;
  void layer_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                  const Tensor& bias, float eps) override;
  void rms_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                float eps) override;
  void gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout, const Tensor& bias,
            float beta, std::int64_t out_row_stride) override;
  void rms_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight, float eps,
                     const Tensor& w, bool swiglu, Tensor h_scratch, Tensor y_scratch) override;
  void gemm_rms_norm_gemm(Tensor x, const Tensor& a, const Tensor& w_res, const Tensor& norm_weight, float eps,
                          const Tensor& w, bool swiglu, Tensor out, Tensor h_scratch, Tensor y_scratch) override;
  void layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                       const Tensor& norm_bias, float eps, const Tensor& w, WeightLayout layout,
                       const Tensor& bias, bool gelu, Tensor h_scratch) override;
  bool fuses_rms_norm_mlp(const Tensor& x, const Tensor& gate_up_w, const Tensor& down_w) const noexcept override;
  void rms_norm_mlp(Tensor x, const Tensor& norm_weight, float eps, const Tensor& gate_up_w, const Tensor& down_w,
                    Tensor act_scratch, Tensor h_scratch, Tensor y_scratch) override;
  void qk_transform_store(Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                          const DeviceBatch& batch, KvLayer cache) override;
  void attention(Tensor out, const Tensor& qkv, const HeadGeometry& heads,
                 const DeviceBatch& batch, const KvLayer& cache, float scale) override;
  void qk_attention(Tensor out, Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                    const DeviceBatch& batch, KvLayer cache, float scale) override;
  void prefetch_next(const Tensor& w) override { next_weight_ = w; }
  std::int64_t attention_l2_next_bytes(const Tensor& w, std::int64_t rows) const;
  void gelu(Tensor x) override;
  void swiglu(Tensor out, const Tensor& gate_up) override;
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override;
  void sample(Tensor logits, const SamplingBatch& params, std::int32_t* out_ids) override;
  std::uint64_t sample_async(Tensor logits, const SamplingBatch& params, Tensor ids_out) override;
  void wait_sampled(std::uint64_t ticket, std::int32_t* out_ids) override;
  void resolve_tokens(Tensor tokens, const Tensor& sampled) override;
  bool samples_async() const noexcept override { return true; }
  void logprobs(const Tensor& logits, const std::int32_t* ids, std::int32_t top_n,
                float* out_logprobs, std::int32_t* out_top_ids, float* out_top_logprobs) override;
  void run_graph(std::uint64_t key, const std::function<void()>& ops) override;
  bool records_graphs() const noexcept override { return true; }
  std::size_t recorded_graphs() const noexcept override { return graphs_.size(); }

 private:
  // gemm and rms_norm_gemm with what the op around them knows of the next kernel (GemvChain:
  // gemm_rms_norm_gemm at one row).
  void gemm_chained(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout, const Tensor& bias,
                    float beta, std::int64_t out_row_stride, const GemvChain& chain);
  void rms_norm_gemm_chained(Tensor out, const Tensor& x, const Tensor& norm_weight, float eps, const Tensor& w,
                             bool swiglu, Tensor h_scratch, Tensor y_scratch, const GemvChain& chain,
                             L2Prefetch skinny_next = {});
  // Enqueues sampling into ids_dev (null: the staging area's own ids) and the ids' copy to the
  // host; returns the slot (index into sample_slots_) that wait_slot reads.
  std::size_t enqueue_sample(Tensor logits, const SamplingBatch& params, std::int32_t* ids_dev);
  void wait_slot(std::size_t slot, std::int32_t* out_ids);
  // upload_batch's copy; `growing` >= 0 arms prepare_decode to advance that many sequences in
  // the steps that skip their copy (upload_decode_batch), -1 leaves it disarmed.
  DeviceBatch copy_batch(const ForwardBatch& batch, std::int32_t growing);
  void stage_to_device(char* dst, const char* src, std::size_t bytes);
  void host_copy(char* dst, const char* src, std::size_t bytes);
  // gemv_partial_ and gemv_tickets_ sized for an in_out GEMV of that shape (launch_gemv).
  void ensure_gemv_scratch(DType dt, bool in_out, std::int64_t m, std::int64_t n, std::int64_t k);
  // The checked kernel parameters of qk_transform_store and attention (Error on bad shapes).
  QkTransformParams qk_params(const Tensor& qkv, const HeadGeometry& heads, const QkTransform& t,
                              const DeviceBatch& batch, const KvLayer& cache) const;
  AttentionParams attention_params(const Tensor& out, const Tensor& qkv, const HeadGeometry& heads,
                                   const DeviceBatch& batch, const KvLayer& cache, float scale) const;
  // The split-KV launch shape of a row-kernel attention (from the context bucket, so graphs stay
  // valid while contexts grow within it) and its scratch: partials and tickets.
  void set_attention_splits(AttentionParams& p, DType dt, const DeviceBatch& batch);
  void norm(const char* op, bool rms, Tensor out, const Tensor& x, Tensor residual,
            const Tensor& weight, const Tensor& bias, float eps);
  // Grows a scratch buffer of the work arena; growing drops recorded graphs (they hold the old
  // address), and is refused while recording.
  void ensure_scratch(Buffer& buf, std::size_t bytes);
  void clear_graphs() noexcept;
  // Ends the XSERV_CUDA_PROFILE_REPLAY range that run_graph opened, if one is open.
  void close_profile_range();

  int device_index_;
  std::string name_;
  int sm_count_ = 0;
  std::int64_t l2_bytes_ = 0;  // the device's L2 cache
  double dram_peak_ = 0;       // the device's DRAM peak in bytes/s (clock x bus width x 2)
  Tensor next_weight_;  // prefetch_next's hint, taken (and cleared) by qk_attention and gemm_rms_norm_gemm
  cudaStream_t stream_ = nullptr;
  DeviceArena weights_;
  DeviceArena work_;
  std::unique_ptr<Gemm> gemm_;

  // Weight upload.
  std::vector<PinnedBuffer> staging_;
  std::vector<cudaEvent_t> staging_events_;
  int staging_cur_ = 0;
  std::size_t staging_used_ = 0;
  Buffer transit_;  // f16 weights land here before their conversion to bf16
  std::unique_ptr<ThreadPool> copy_pool_;

  // Batch metadata: fixed buffers, reused by every upload_batch.
  BatchLayout batch_layout_;
  PinnedBuffer batch_host_;
  Buffer batch_device_;
  cudaEvent_t batch_copied_ = nullptr;  // the last upload's copies left batch_host_
  std::tuple<std::int32_t, std::int32_t, std::int32_t, std::int32_t, std::int32_t, std::int32_t>
      batch_shape_{};
  // Decode batches kept on the device (upload_decode_batch): the batch the buffers hold once the
  // next prepare_decode has run, and whether one has run since (a replayed recording runs it
  // too: Graph::prepares). XSERV_CUDA_DEVICE_BATCH bit 1 (default on).
  bool keep_decode_batches_ = true;
  ForwardBatch kept_;
  DeviceBatch kept_view_;
  std::int32_t kept_growing_ = 0;
  bool kept_valid_ = false;
  bool kept_prepared_ = false;
  bool capture_prepares_ = false;  // prepare_decode was called while recording

  // Split-KV partials and sampling inputs.
  Buffer split_scratch_;
  Buffer attention_tickets_;  // AttentionParams::tickets of the decode attention (kept zeroed)
  Buffer gemv_partial_, gemv_tickets_;  // split-K partials and per-tile tickets (kept zeroed)
  // Sampling inputs go up and ids come down through a staging slot: pinned memory and the event
  // after its last copy. A slot stays busy from enqueue_sample until its ids are read, so the
  // host never rewrites memory a pending copy still reads while steps overlap (sample_async);
  // the synchronous sample() takes and frees one the same way.
  struct SampleSlot {
    PinnedBuffer host;
    cudaEvent_t done = nullptr;
    std::size_t ids_offset = 0;  // where the ids land in `host`
    std::int32_t rows = 0;
    bool busy = false;
  };
  std::vector<std::unique_ptr<SampleSlot>> sample_slots_;
  // An overlapped step's sampling copies (sample_async; XSERV_CUDA_DEVICE_BATCH bit 2, default
  // on) run on copy_stream_ instead of the forward's stream, so the next step's graph starts
  // right after the sampling kernels instead of behind two DMAs: the inputs go up while the
  // forward runs (params_ready_), the ids come down after the kernels (sampling_done_, which
  // also orders the next inputs' copy after the kernels that read the previous ones).
  bool side_copies_ = true;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t params_ready_ = nullptr;
  cudaEvent_t sampling_done_ = nullptr;
  Buffer sample_device_;
  PinnedBuffer logprobs_host_;
  Buffer logprobs_device_;
  Buffer token_counts_;
  Buffer sample_candidates_;  // launch_sample_topk's per-row candidate keys
  Buffer sample_tickets_;     // its one-kernel greedy path's per-row tickets (kept zeroed)
  bool sample_one_pass_ = true;   // XSERV_CUDA_SAMPLE_ONE_PASS=0: greedy batches in two kernels as before
  bool logits_norm_gemv_ = true;  // XSERV_CUDA_LOGITS_NORM_GEMV=0: the final norm and the lm_head apart
  Buffer sample_select_;      // launch_sample's per-row radix-select state

  // CUDA graphs keyed by (caller's key, batch shape).
  struct Graph {
    bool warmed = false;
    cudaGraphExec_t exec = nullptr;
    int replays = 0;
    bool prepares = false;  // the recording begins with prepare_decode
  };
  using GraphKey = std::tuple<std::uint64_t, std::int32_t, std::int32_t, std::int32_t, std::int32_t,
                              std::int32_t, std::int32_t>;
  std::map<GraphKey, Graph> graphs_;
  bool capturing_ = false;
  bool profile_open_ = false;  // a profiled replay's range (run_graph) is still open
  // XSERV_CUDA_GEMV=0 sends decode GEMMs to cuBLASLt too (for comparisons).
  bool use_gemv_ = true;
  // Rows up to which 5+-row bf16 GEMMs take the tensor-core skinny kernel (gemm_skinny.cu)
  // instead of cuBLASLt: XSERV_CUDA_SKINNY_ROWS (0 turns it off, for comparisons; at most 32).
  std::int64_t skinny_rows_ = default_skinny_gemm_rows;
  // What rms_norm_gemm at skinny rows folds into the skinny GEMM (XSERV_CUDA_SKINNY_FUSE, bits):
  // 1 the RMSNorm where there is no SwiGLU (q|k|v), 2 the SwiGLU epilogue (gate|up), 4 the RMSNorm
  // where there is (gate|up). Default 2: on the H200 the SwiGLU epilogue made a 16-row Qwen3-1.7B
  // step 5% faster, and the norm prologue made it slower (each block normalises every row again:
  // blocks x rows x K conversions, 384-768 blocks for gate|up; docs/benchmarks.md). 0: the
  // separate norm, skinny GEMM and swiglu kernels (for comparisons).
  int skinny_fuse_ = 2;
  // Rows up to which rms_norm_gemm takes the fused skinny kernel: XSERV_CUDA_SKINNY_FUSE_ROWS (at
  // most 32), by default the plain skinny GEMM's limit. The fusion saves two or three kernels, so
  // it can pay at rows where the plain skinny GEMM loses to cuBLASLt.
  std::int64_t skinny_fuse_rows_ = -1;
  // XSERV_CUDA_SKINNY_STATS=block: every block of the fused kernel computes the row statistics
  // itself instead of sharing them through skinny_norm_scratch_ (for comparisons).
  bool skinny_block_stats_ = false;
  // XSERV_CUDA_SKINNY_L2_NEXT_MB=N: gemm_rms_norm_gemm's skinny SwiGLU GEMM asks the first N MB of
  // the next op's weight (prefetch_next: the down_proj) into L2 after its loads (opt-in: on an
  // H200, 8 MB gave serving Qwen3-8B 16 at once +0.4% and 1.7B -2.5%).
  int skinny_l2_next_mb_ = 0;
  Buffer skinny_norm_scratch_;  // row statistics and counters of the fused skinny kernel
  // gemm_rms_norm_gemm at rows past the skinny kernel's and up to resid_max_rows: the residual
  // GEMM as XSERV_CUDA_RESID_SPLITS parts of K on cuBLASLt (Gemm::run_split_k, no reduce kernel)
  // and one kernel that adds the parts and the residual and computes the next RMSNorm
  // (launch_residual_rms_norm): one kernel a GEMM fewer than cuBLASLt's split-K reduce (or
  // beta = 1 epilogue) and the separate norm. XSERV_CUDA_RESID_SPLITS=N: N parts, kN: parts of
  // about N of K each (at least one), 0: the separate ops (for comparisons).
  int resid_splits_ = 2;
  std::int64_t resid_part_k_ = 0;  // kN: the K of a part; 0: resid_splits_ parts
  static constexpr std::int64_t resid_max_rows = 256;
  Buffer resid_partials_;  // [splits][resid_max_rows][N] f32
  // XSERV_CUDA_FUSED_MLP=1: a one-row bf16 SwiGLU MLP runs as one kernel (rms_norm_mlp, mlp.cu:
  // thread-block clusters split the intermediates, so the gate|up and down_proj weights stream as
  // one); off by default until measured against the separate GEMVs (docs/cuda.md).
  bool fuse_mlp_ = false;
  int mlp_stages_ = 3;  // XSERV_CUDA_FUSED_MLP_STAGES=2|3|4: the kernel's 4 KB slots a warp (comparisons)
  Buffer mlp_partials_;  // [clusters][N] f32
  Buffer mlp_tickets_;   // mlp_fused_tickets counters, zero between launches
  // XSERV_CUDA_FUSED_NORM=0: layer_norm_gemm runs the separate kernels (for comparisons).
  bool fuse_layer_norm_ = true;
  // XSERV_CUDA_ATTN_STORE_KV=0: GPT-2 decode writes k/v with qk_transform_store before the
  // attention instead of inside it (for comparisons).
  bool fuse_store_kv_ = true;
  // XSERV_CUDA_ADJACENT_WEIGHTS=0 ignores reserve_adjacent_weights (for comparisons: a stacked
  // pair may then straddle two weight chunks and run as separate GEMVs).
  bool adjacent_weights_ = true;
};

CudaBackend::CudaBackend(const BackendOptions& options)
    : device_index_(options.device_index),
      weights_(options.device_index, weight_chunk_bytes),
      work_(options.device_index, work_chunk_bytes) {
  int count = 0;
  XSERV_CUDA_CHECK(cudaGetDeviceCount(&count));
  XSERV_CHECK(device_index_ >= 0 && device_index_ < count, ErrorCode::cuda,
              "CUDA device {} requested, {} visible", device_index_, count);
  XSERV_CUDA_CHECK(cudaSetDevice(device_index_));
  cudaDeviceProp prop{};
  XSERV_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index_));
  sm_count_ = prop.multiProcessorCount;
  l2_bytes_ = prop.l2CacheSize;
  {
    int mem_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device_index_) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device_index_) == cudaSuccess)
      dram_peak_ = 2.0 * mem_khz * 1e3 * bus_bits / 8;
    (void)cudaGetLastError();  // unreported: the peak stays unknown (0) and rules keyed on it do not hold
  }
  name_ = fmt::format("cuda:{} ({}, sm_{}{})", device_index_, prop.name, prop.major, prop.minor);
  XSERV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  XSERV_CUDA_CHECK(cudaEventCreateWithFlags(&batch_copied_, cudaEventDisableTiming));
  // cuBLASLt algorithms of the batched-decode row buckets timed during the load's warm-up
  // (cuda/gemm.hpp; off by default, measured no faster): XSERV_CUDA_GEMM_TUNE=N times the
  // heuristic's first N (0: the heuristic's first everywhere), XSERV_CUDA_GEMM_TUNE_SPLITK=0
  // leaves out the split-K variants.
  GemmTuning gemm_tuning = default_gemm_tuning;
  if (const char* env = std::getenv("XSERV_CUDA_GEMM_TUNE")) gemm_tuning.candidates = std::atoi(env);
  if (const char* env = std::getenv("XSERV_CUDA_GEMM_TUNE_SPLITK")) gemm_tuning.split_k = std::string_view(env) != "0";
  gemm_ = std::make_unique<Gemm>(stream_, work_, gemm_tuning);
  if (const char* env = std::getenv("XSERV_CUDA_GEMV")) use_gemv_ = std::string_view(env) != "0";
  if (const char* env = std::getenv("XSERV_CUDA_SKINNY_ROWS")) skinny_rows_ = std::atoll(env);
  if (const char* env = std::getenv("XSERV_CUDA_SKINNY_FUSE")) skinny_fuse_ = std::atoi(env);
  if (const char* env = std::getenv("XSERV_CUDA_SKINNY_FUSE_ROWS")) skinny_fuse_rows_ = std::atoll(env);
  if (skinny_fuse_rows_ < 0) skinny_fuse_rows_ = skinny_rows_;
  if (const char* env = std::getenv("XSERV_CUDA_RESID_SPLITS")) {
    // At most 8 parts either way (the kN rule's bound): the f32 partials are parts x 256 rows x N.
    if (env[0] == 'k') resid_part_k_ = std::max(0, std::atoi(env + 1));
    else resid_splits_ = std::clamp(std::atoi(env), 0, 8);
  }
  if (const char* env = std::getenv("XSERV_CUDA_SKINNY_STATS")) skinny_block_stats_ = std::string_view(env) == "block";
  if (const char* env = std::getenv("XSERV_CUDA_SKINNY_L2_NEXT_MB")) skinny_l2_next_mb_ = std::max(0, std::atoi(env));
  if (const char* env = std::getenv("XSERV_CUDA_FUSED_NORM")) fuse_layer_norm_ = std::string_view(env) != "0";
  if (const char* env = std::getenv("XSERV_CUDA_FUSED_MLP")) fuse_mlp_ = std::string_view(env) == "1";
  if (const char* env = std::getenv("XSERV_CUDA_FUSED_MLP_STAGES")) mlp_stages_ = std::clamp(std::atoi(env), 2, 4);
  if (const char* env = std::getenv("XSERV_CUDA_SAMPLE_ONE_PASS")) sample_one_pass_ = std::string_view(env) != "0";
  if (const char* env = std::getenv("XSERV_CUDA_LOGITS_NORM_GEMV")) logits_norm_gemv_ = std::string_view(env) != "0";
  if (const char* env = std::getenv("XSERV_CUDA_ATTN_STORE_KV")) fuse_store_kv_ = std::string_view(env) != "0";
  if (const char* env = std::getenv("XSERV_CUDA_ADJACENT_WEIGHTS")) adjacent_weights_ = std::string_view(env) != "0";
  if (const char* env = std::getenv("XSERV_CUDA_DEVICE_BATCH")) {
    const int bits = std::atoi(env);
    keep_decode_batches_ = (bits & 1) != 0;
    side_copies_ = (bits & 2) != 0;
  }
  if (side_copies_) {
    XSERV_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    XSERV_CUDA_CHECK(cudaEventCreateWithFlags(&params_ready_, cudaEventDisableTiming));
    XSERV_CUDA_CHECK(cudaEventCreateWithFlags(&sampling_done_, cudaEventDisableTiming));
  }
}

CudaBackend::~CudaBackend() {
  if (stream_) (void)cudaStreamSynchronize(stream_);
  if (copy_stream_) (void)cudaStreamSynchronize(copy_stream_);
  clear_graphs();
  gemm_.reset();
  for (auto e : staging_events_) (void)cudaEventDestroy(e);
  if (batch_copied_) (void)cudaEventDestroy(batch_copied_);
  if (params_ready_) (void)cudaEventDestroy(params_ready_);
  if (sampling_done_) (void)cudaEventDestroy(sampling_done_);
  for (auto& slot : sample_slots_)
    if (slot->done) (void)cudaEventDestroy(slot->done);
  // Buffers from work_ are released by their own destructors before work_ (declared earlier).
  transit_ = Buffer();
  batch_device_ = Buffer();
  split_scratch_ = Buffer();
  attention_tickets_ = Buffer();
  gemv_partial_ = Buffer();
  gemv_tickets_ = Buffer();
  skinny_norm_scratch_ = Buffer();
  sample_device_ = Buffer();
  sample_candidates_ = Buffer();
  sample_tickets_ = Buffer();
  sample_select_ = Buffer();
  logprobs_device_ = Buffer();
  token_counts_ = Buffer();
  if (copy_stream_) (void)cudaStreamDestroy(copy_stream_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void CudaBackend::close_profile_range() {
  if (!profile_open_) return;
  profile_open_ = false;
  XSERV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  XSERV_CUDA_CHECK(cudaProfilerStop());
}

void CudaBackend::clear_graphs() noexcept {
  for (auto& [k, g] : graphs_)
    if (g.exec) (void)cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void CudaBackend::ensure_scratch(Buffer& buf, std::size_t bytes) {
  if (buf.size() >= bytes) return;
  XSERV_CHECK(!capturing_, ErrorCode::internal,
              "CUDA graph capture needs {} bytes of scratch that warm-up did not allocate", bytes);
  clear_graphs();
  const std::size_t grown = round_up(std::max(bytes, buf.size() * 2), 1 << 20);
  buf = Buffer();
  buf = Buffer(work_, grown);
}

// ---- memory ------------------------------------------------------------------------------

void CudaBackend::host_copy(char* dst, const char* src, std::size_t bytes) {
  constexpr std::size_t piece = std::size_t{4} << 20;
  if (bytes <= piece) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (!copy_pool_) {
    const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
    copy_pool_ = std::make_unique<ThreadPool>(std::min<std::size_t>(hw, 8));
  }
  // Reading the mmap'd file (page cache) is the slow side of a load: several threads fault and
  // copy pages at once.
  copy_pool_->parallel_for((bytes + piece - 1) / piece, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      const std::size_t off = i * piece;
      std::memcpy(dst + off, src + off, std::min(piece, bytes - off));
    }
  });
}

void CudaBackend::stage_to_device(char* dst, const char* src, std::size_t bytes) {
  if (staging_.empty()) {
    for (int i = 0; i < staging_count; ++i) {
      staging_.emplace_back(staging_bytes);
      cudaEvent_t e = nullptr;
      XSERV_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      staging_events_.push_back(e);
    }
  }
  for (std::size_t off = 0; off < bytes;) {
    const std::size_t n = std::min(staging_bytes, bytes - off);
    if (staging_used_ + n > staging_bytes) {
      // Next buffer of the ring; its last DMA must be done before the host overwrites it.
      staging_cur_ = (staging_cur_ + 1) % staging_count;
      XSERV_CUDA_CHECK(cudaEventSynchronize(staging_events_[staging_cur_]));
      staging_used_ = 0;
    }
    char* pinned = staging_[staging_cur_].data() + staging_used_;
    host_copy(pinned, src + off, n);
    XSERV_CUDA_CHECK(cudaMemcpyAsync(dst + off, pinned, n, cudaMemcpyHostToDevice, stream_));
    XSERV_CUDA_CHECK(cudaEventRecord(staging_events_[staging_cur_], stream_));
    staging_used_ += round_up(n, 256);
    off += n;
  }
}

Tensor CudaBackend::import_weight(const Tensor& host) {
  XSERV_CHECK(host.device.kind == DeviceKind::cpu, ErrorCode::invalid_argument,
              "import_weight: the source must be host memory");
  const DType dt = host.dtype == DType::f16 ? DType::bf16 : host.dtype;
  const std::size_t bytes = static_cast<std::size_t>(host.numel()) * dtype_size(dt);
  auto* dst = static_cast<char*>(weights_.allocate(bytes));
  const auto* src = static_cast<const char*>(host.data);
  if (host.dtype == DType::f16) {
    if (!transit_) transit_ = Buffer(work_, staging_bytes);
    const std::size_t elems_per = staging_bytes / 2;
    for (std::int64_t e = 0; e < host.numel(); e += static_cast<std::int64_t>(elems_per)) {
      const std::int64_t n = std::min<std::int64_t>(static_cast<std::int64_t>(elems_per), host.numel() - e);
      stage_to_device(static_cast<char*>(transit_.data()), src + e * 2, static_cast<std::size_t>(n) * 2);
      launch_convert(stream_, DType::f16, DType::bf16, transit_.data(), dst + e * 2, n);
    }
  } else {
    stage_to_device(dst, src, bytes);
  }
  return Tensor(dst, dt, host.shape, device());
}

void CudaBackend::upload(Tensor dst, const void* host_src) {
  if (dst.bytes() == 0) return;
  XSERV_CUDA_CHECK(cudaMemcpyAsync(dst.data, host_src, dst.bytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(void* host_dst, const Tensor& src) {
  if (src.bytes() > 0)
    XSERV_CUDA_CHECK(cudaMemcpyAsync(host_dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_));
  XSERV_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fill_zero(Tensor dst) {
  if (dst.bytes() > 0) XSERV_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, dst.bytes(), stream_));
}

void CudaBackend::copy(Tensor dst, const Tensor& src) {
  XSERV_CHECK(dst.bytes() == src.bytes(), ErrorCode::invalid_argument,
              "copy: {} bytes into {} bytes", src.bytes(), dst.bytes());
  if (dst.bytes() > 0 && dst.data != src.data)
    XSERV_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::transpose(Tensor dst, const Tensor& src) {
  XSERV_CHECK(src.shape.rank() == 2 && dst.shape == Shape({src.shape[1], src.shape[0]}) &&
                  dst.dtype == src.dtype && (dtype_size(src.dtype) == 2 || dtype_size(src.dtype) == 4),
              ErrorCode::invalid_argument, "transpose: {} {} into {} {}", dtype_name(src.dtype),
              src.shape, dtype_name(dst.dtype), dst.shape);
  launch_transpose(stream_, dtype_size(src.dtype), src.data, dst.data, src.shape[0], src.shape[1]);
}

MemoryInfo CudaBackend::memory_info() const {
  std::size_t free_bytes = 0, total_bytes = 0;
  XSERV_CUDA_CHECK(cudaSetDevice(device_index_));
  XSERV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return MemoryInfo{free_bytes, total_bytes};
}

DeviceBatch CudaBackend::upload_batch(const ForwardBatch& b) {
  kept_valid_ = false;
  return copy_batch(b, -1);
}

namespace {

// Whether `b` is `kept` one token further for its first `growing` sequences (a decode batch:
// one token per sequence) and the same otherwise, so that prepare_decode's +1 gives it exactly.
bool advanced_by_one(const ForwardBatch& kept, const ForwardBatch& b, std::int32_t growing) {
  const std::int32_t s = b.num_seqs();
  if (b.num_tokens() != s || kept.num_tokens() != s || kept.num_seqs() != s || growing > s ||
      b.max_blocks_per_seq != kept.max_blocks_per_seq || b.token_ids != kept.token_ids ||
      b.query_start != kept.query_start || b.logit_rows != kept.logit_rows ||
      b.block_tables != kept.block_tables)
    return false;
  for (std::int32_t i = 0; i < s; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const std::int32_t d = i < growing ? 1 : 0;
    if (b.positions[k] != kept.positions[k] + d || b.slot_mapping[k] != kept.slot_mapping[k] + d ||
        b.context_lens[k] != kept.context_lens[k] + d)
      return false;
  }
  return true;
}

bool one_token_per_seq(const ForwardBatch& b) {
  for (std::int32_t i = 0; i <= b.num_seqs(); ++i)
    if (b.query_start[static_cast<std::size_t>(i)] != i) return false;
  return b.num_tokens() == b.num_seqs();
}

}  // namespace

DeviceBatch CudaBackend::upload_decode_batch(const ForwardBatch& b, std::int32_t growing) {
  if (!keep_decode_batches_ || growing < 0 || growing > b.num_seqs() || !one_token_per_seq(b))
    return upload_batch(b);
  if (kept_valid_ && kept_prepared_ && growing == kept_growing_ && advanced_by_one(kept_, b, growing)) {
    // The steady state: prepare_decode advances what the device holds (armed by the last
    // copy, kept armed by every prepare since), nothing goes up.
    kept_.positions = b.positions;
    kept_.slot_mapping = b.slot_mapping;
    kept_.context_lens = b.context_lens;
    kept_prepared_ = false;
    kept_view_.max_context_len = b.max_context_len();
    std::get<4>(batch_shape_) = std::max(256, next_pow2(kept_view_.max_context_len));
    return kept_view_;
  }
  kept_view_ = copy_batch(b, growing);
  kept_ = b;
  kept_growing_ = growing;
  kept_valid_ = true;
  kept_prepared_ = false;
  return kept_view_;
}

void CudaBackend::prepare_decode(const DeviceBatch& batch, const Tensor& sampled) {
  auto* dev = static_cast<std::int32_t*>(batch_device_.data());
  const BatchLayout& l = batch_layout_;
  XSERV_CHECK(dev != nullptr && batch.token_ids.data == dev + l.tokens &&
                  batch.num_tokens == batch.num_seqs && sampled.dtype == DType::i32,
              ErrorCode::invalid_argument,
              "prepare_decode: not the last uploaded decode batch, or sampled ids of {}",
              dtype_name(sampled.dtype));
  launch_prepare_decode(stream_, dev + l.tokens, dev + l.token_src, dev + l.positions,
                        dev + l.slots, dev + l.context_lens, dev + l.control, batch.num_tokens,
                        sampled.empty() ? nullptr : sampled.as<std::int32_t>());
  kept_prepared_ = true;
  if (capturing_) capture_prepares_ = true;
}

DeviceBatch CudaBackend::copy_batch(const ForwardBatch& b, std::int32_t growing) {
  const std::int64_t t = b.num_tokens(), s = b.num_seqs(), r = static_cast<std::int64_t>(b.logit_rows.size());
  XSERV_CHECK(b.positions.size() == static_cast<std::size_t>(t) &&
                  b.slot_mapping.size() == static_cast<std::size_t>(t) &&
                  b.query_start.size() == static_cast<std::size_t>(s + 1) && r <= t &&
                  b.block_tables.size() == static_cast<std::size_t>(s * b.max_blocks_per_seq),
              ErrorCode::invalid_argument, "upload_batch: inconsistent batch sizes");
  const std::int32_t stride = std::max(8, next_pow2(b.max_blocks_per_seq));
  if (t > batch_layout_.cap_tokens || s > batch_layout_.cap_seqs || s * stride > batch_layout_.cap_table) {
    XSERV_CHECK(!capturing_, ErrorCode::internal, "upload_batch while recording a CUDA graph");
    if (batch_copied_) XSERV_CUDA_CHECK(cudaEventSynchronize(batch_copied_));
    const auto layout = BatchLayout::make(std::max<std::int64_t>(t, std::max<std::int64_t>(1024, batch_layout_.cap_tokens)),
                                          std::max<std::int64_t>(s, std::max<std::int64_t>(256, batch_layout_.cap_seqs)),
                                          std::max<std::int64_t>(s * stride, std::max<std::int64_t>(256 * 64, batch_layout_.cap_table * 2)));
    clear_graphs();
    batch_device_ = Buffer();
    batch_device_ = Buffer(work_, static_cast<std::size_t>(layout.total) * 4);
    batch_host_ = PinnedBuffer(static_cast<std::size_t>(layout.total) * 4);
    batch_layout_ = layout;
  }
  // The previous upload's copies must have left the pinned buffer before it is rewritten.
  XSERV_CUDA_CHECK(cudaEventSynchronize(batch_copied_));
  const BatchLayout& l = batch_layout_;
  auto* host = reinterpret_cast<std::int32_t*>(batch_host_.data());
  auto* dev = static_cast<std::int32_t*>(batch_device_.data());
  auto put = [&](std::int64_t off, const std::int32_t* src, std::int64_t n) {
    if (n > 0) std::memcpy(host + off, src, static_cast<std::size_t>(n) * 4);
  };
  put(l.tokens, b.token_ids.data(), t);
  put(l.token_src, b.token_ids.data(), t);
  host[l.control] = 0;  // these values are the step's own: the next prepare_decode keeps them
  host[l.control + 1] = std::max(growing, 0);
  put(l.positions, b.positions.data(), t);
  put(l.slots, b.slot_mapping.data(), t);
  put(l.logit_rows, b.logit_rows.data(), r);
  put(l.query_start, b.query_start.data(), s + 1);
  put(l.context_lens, b.context_lens.data(), s);
  std::int32_t* table = host + l.block_tables;
  std::fill(table, table + s * stride, 0);
  for (std::int64_t i = 0; i < s; ++i)
    std::copy_n(b.block_tables.data() + i * b.max_blocks_per_seq, b.max_blocks_per_seq, table + i * stride);
  // One copy of the whole prefix up to the used block tables: a decode step's few integers cost
  // one DMA instead of seven (the gaps are a few KB).
  const std::size_t bytes = static_cast<std::size_t>(l.block_tables + s * stride) * 4;
  XSERV_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
  XSERV_CUDA_CHECK(cudaEventRecord(batch_copied_, stream_));

  DeviceBatch d;
  const Device dv = device();
  d.token_ids = Tensor(dev + l.tokens, DType::i32, {t}, dv);
  d.positions = Tensor(dev + l.positions, DType::i32, {t}, dv);
  d.slot_mapping = Tensor(dev + l.slots, DType::i32, {t}, dv);
  d.logit_rows = Tensor(dev + l.logit_rows, DType::i32, {r}, dv);
  d.query_start = Tensor(dev + l.query_start, DType::i32, {s + 1}, dv);
  d.context_lens = Tensor(dev + l.context_lens, DType::i32, {s}, dv);
  d.block_tables = Tensor(dev + l.block_tables, DType::i32, {s, stride}, dv);
  d.num_tokens = static_cast<std::int32_t>(t);
  d.num_seqs = static_cast<std::int32_t>(s);
  d.num_logit_rows = static_cast<std::int32_t>(r);
  d.max_query_len = b.max_query_len();
  d.max_context_len = b.max_context_len();
  d.max_blocks_per_seq = stride;
  batch_shape_ = {d.num_tokens, d.num_seqs, d.num_logit_rows, d.max_query_len,
                  std::max(256, next_pow2(d.max_context_len)), stride};
  return d;
}

// ---- ops ---------------------------------------------------------------------------------

void CudaBackend::embedding(Tensor out, const Tensor& ids, const Tensor& table,
                            const Tensor& pos_table, const Tensor& positions) {
  const DType dt = out.dtype;
  XSERV_CHECK(is_act(dt) && table.dtype == dt && (pos_table.empty() || pos_table.dtype == dt) &&
                  ids.dtype == DType::i32 && out.shape.rank() == 2 && table.shape.rank() == 2 &&
                  table.shape[1] == out.shape[1] && ids.numel() == out.shape[0] &&
                  (pos_table.empty() || (positions.numel() == out.shape[0] &&
                                         pos_table.shape[1] == out.shape[1])),
              ErrorCode::invalid_argument,
              "embedding: out {} ({}), ids {}, table {} ({}), pos_table {} do not fit", out.shape,
              dtype_name(dt), ids.shape, table.shape, dtype_name(table.dtype), pos_table.shape);
  launch_embedding(stream_, dt, out.data, ids.as<std::int32_t>(), table.data,
                   pos_table.empty() ? nullptr : pos_table.data,
                   pos_table.empty() ? nullptr : positions.as<std::int32_t>(), out.shape[0],
                   out.shape[1], table.shape[0], pos_table.empty() ? 0 : pos_table.shape[0]);
}

void CudaBackend::norm(const char* op, bool rms, Tensor out, const Tensor& x, Tensor residual,
                       const Tensor& weight, const Tensor& bias, float eps) {
  const DType dt = x.dtype;
  const std::int64_t dim = x.shape.back();
  const std::int64_t rows = dim ? x.numel() / dim : 0;
  XSERV_CHECK(is_act(dt) && out.dtype == dt && out.numel() == x.numel() && weight.dtype == dt &&
                  weight.numel() == dim && (bias.empty() || (bias.dtype == dt && bias.numel() == dim)) &&
                  (residual.empty() || (residual.dtype == dt && residual.numel() == x.numel())),
              ErrorCode::invalid_argument,
              "{}: x {} ({}), out {}, residual {}, weight {} ({}), bias {} do not fit", op, x.shape,
              dtype_name(dt), out.shape, residual.shape, weight.shape, dtype_name(weight.dtype),
              bias.shape);
  launch_norm(stream_, dt, rms, out.data, x.data, residual.empty() ? nullptr : residual.data,
              weight.data, bias.empty() ? nullptr : bias.data, eps, rows, dim);
}

void CudaBackend::layer_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                             const Tensor& bias, float eps) {
  norm("layer_norm", false, out, x, residual, weight, bias, eps);
}

void CudaBackend::rms_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                           float eps) {
  norm("rms_norm", true, out, x, residual, weight, Tensor(), eps);
}

void CudaBackend::gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                       const Tensor& bias, float beta, std::int64_t out_row_stride) {
  gemm_chained(out, a, w, layout, bias, beta, out_row_stride, {});
}

void CudaBackend::gemm_chained(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                               const Tensor& bias, float beta, std::int64_t out_row_stride,
                               const GemvChain& chain) {
  XSERV_CHECK(a.shape.rank() == 2 && w.shape.rank() == 2 && out.shape.rank() == 2,
              ErrorCode::invalid_argument, "gemm: a {}, w {}, out {} must be matrices", a.shape,
              w.shape, out.shape);
  const std::int64_t m = a.shape[0], k = a.shape[1];
  const std::int64_t wk = layout == WeightLayout::in_out ? w.shape[0] : w.shape[1];
  const std::int64_t n = layout == WeightLayout::in_out ? w.shape[1] : w.shape[0];
  const std::int64_t ldo = out_row_stride ? out_row_stride : n;
  XSERV_CHECK(wk == k && out.shape[0] == m && out.shape[1] == n && ldo >= n &&
                  (bias.empty() || bias.numel() == n),
              ErrorCode::invalid_argument, "gemm: a {} . w {} ({}) does not give out {} (bias {})",
              a.shape, w.shape, layout == WeightLayout::in_out ? "in_out" : "out_in", out.shape,
              bias.shape);
  XSERV_CHECK(is_act(a.dtype) && w.dtype == a.dtype && (out.dtype == a.dtype || out.dtype == DType::f32) &&
                  (bias.empty() || (bias.dtype == a.dtype && out.dtype == a.dtype)),
              ErrorCode::unsupported, "gemm: a {}, w {}, out {}, bias {} is not a supported dtype mix",
              dtype_name(a.dtype), dtype_name(w.dtype), dtype_name(out.dtype),
              bias.empty() ? "none" : dtype_name(bias.dtype));
  const bool in_out = layout == WeightLayout::in_out;
  if (use_gemv_ && gemv_supported(a.dtype, in_out, m, n, k, a.data, w.data)) {
    // Decode-sized products stream the weight once through own kernels (cuBLASLt's small-M
    // kernels leave bandwidth unused and cost more launches).
    ensure_gemv_scratch(a.dtype, in_out, m, n, k);
    launch_gemv(stream_, a.dtype, out.dtype, in_out, out.data, ldo, a.data, w.data,
                bias.empty() ? nullptr : bias.data, beta, m, n, k, sm_count_,
                static_cast<float*>(gemv_partial_.data()), static_cast<unsigned*>(gemv_tickets_.data()), chain);
    return;
  }
  if (!in_out && skinny_gemm_supported(a.dtype, m, n, k, a.data, w.data, skinny_rows_)) {
    // A handful of rows: one pass over the weight on tensor cores (cuBLASLt leaves SMs idle).
    launch_skinny_gemm(stream_, out.dtype, out.data, ldo, a.data, w.data, bias.empty() ? nullptr : bias.data,
                       beta, m, n, k, sm_count_);
    return;
  }
  XSERV_CHECK(k > 0, ErrorCode::unsupported, "gemm: K = 0");
  gemm_->run(a.dtype, out.dtype, out.data, ldo, a.data, w.data, layout,
             bias.empty() ? nullptr : bias.data, beta, m, n, k);
}

void CudaBackend::ensure_gemv_scratch(DType dt, bool in_out, std::int64_t m, std::int64_t n,
                                      std::int64_t k) {
  const std::size_t partial = gemv_scratch_floats(dt, in_out, m, n, k, sm_count_);
  if (partial == 0) return;
  ensure_scratch(gemv_partial_, partial * sizeof(float));
  const std::size_t tickets = gemv_tickets(dt, n) * sizeof(unsigned);
  if (gemv_tickets_.size() < tickets) {
    ensure_scratch(gemv_tickets_, tickets);
    XSERV_CUDA_CHECK(cudaMemsetAsync(gemv_tickets_.data(), 0, gemv_tickets_.size(), stream_));
  }
}

void CudaBackend::layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                                  const Tensor& norm_bias, float eps, const Tensor& w,
                                  WeightLayout layout, const Tensor& bias, bool gelu,
                                  Tensor h_scratch) {
  const DType dt = x.dtype;
  const bool in_out = layout == WeightLayout::in_out;
  const std::int64_t m = x.shape.rank() == 2 ? x.shape[0] : 0, k = x.shape.back();
  const std::int64_t n = w.shape.rank() == 2 ? w.shape[in_out ? 1 : 0] : 0;
  const bool shapes_ok = x.shape.rank() == 2 && w.shape.rank() == 2 && out.shape.rank() == 2 &&
                         w.shape[in_out ? 0 : 1] == k && norm_weight.numel() == k &&
                         (norm_bias.empty() || norm_bias.numel() == k) &&
                         out.shape[0] == m && out.shape[1] == n && (bias.empty() || bias.numel() == n);
  const bool dtypes_ok = is_act(dt) && w.dtype == dt && norm_weight.dtype == dt && out.dtype == dt &&
                         (norm_bias.empty() || norm_bias.dtype == dt) && (bias.empty() || bias.dtype == dt);
  const LayerNormGemvArgs args{out.data, x.data, norm_weight.data,
                               norm_bias.empty() ? nullptr : norm_bias.data, eps, w.data,
                               bias.empty() ? nullptr : bias.data, gelu, m, n, k, in_out};
  // Decode-sized GPT-2 blocks: one kernel (LayerNorm prologue, GELU epilogue).
  if (shapes_ok && dtypes_ok && use_gemv_ && fuse_layer_norm_ && layer_norm_gemv_supported(dt, args)) {
    if (in_out) ensure_gemv_scratch(dt, true, m, n, k);
    launch_layer_norm_gemv(stream_, dt, args, sm_count_, static_cast<float*>(gemv_partial_.data()),
                           static_cast<unsigned*>(gemv_tickets_.data()));
    return;
  }
  // Larger batches and bad shapes or dtypes, which the separate ops reject.
  Backend::layer_norm_gemm(out, x, norm_weight, norm_bias, eps, w, layout, bias, gelu, h_scratch);
}

void CudaBackend::rms_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                                float eps, const Tensor& w, bool swiglu, Tensor h_scratch,
                                Tensor y_scratch) {
  rms_norm_gemm_chained(out, x, norm_weight, eps, w, swiglu, h_scratch, y_scratch, {});
}

void CudaBackend::rms_norm_gemm_chained(Tensor out, const Tensor& x, const Tensor& norm_weight, float eps,
                                        const Tensor& w, bool swiglu, Tensor h_scratch, Tensor y_scratch,
                                        const GemvChain& chain, L2Prefetch skinny_next) {
  const DType dt = x.dtype;
  const bool shapes_ok = x.shape.rank() == 2 && w.shape.rank() == 2 && out.shape.rank() == 2 &&
                         w.shape[1] == x.shape[1] && norm_weight.numel() == x.shape[1] &&
                         out.shape[0] == x.shape[0] && (!swiglu || w.shape[0] % 2 == 0) &&
                         out.shape[1] == (swiglu ? w.shape[0] / 2 : w.shape[0]);
  const bool dtypes_ok = is_act(dt) && w.dtype == dt && norm_weight.dtype == dt && out.dtype == dt;
  // Logits (bf16 x, f32 out: a decode step's final norm and lm_head) of one row: the norm GEMV
  // too (XSERV_CUDA_LOGITS_NORM_GEMV); otherwise, and at more rows, the separate kernels.
  const bool logits_ok = logits_norm_gemv_ && dt == DType::bf16 && w.dtype == dt && norm_weight.dtype == dt &&
                         out.dtype == DType::f32 && !swiglu && shapes_ok && x.shape[0] == 1;
  // Decode-sized products run as one kernel: the norm in its prologue, SwiGLU in its epilogue.
  if (shapes_ok && (dtypes_ok || logits_ok) && use_gemv_ &&
      norm_gemv_supported(dt, x.shape[0], w.shape[0], x.shape[1], x.data, norm_weight.data, w.data)) {
    launch_norm_gemv(stream_, dt, out.data, x.data, norm_weight.data, eps, w.data, swiglu,
                     x.shape[0], out.shape[1], x.shape[1], sm_count_, out.dtype, chain);
    return;
  }
  // 5-32 rows (batched decode): the skinny tensor-core GEMM with the same fusions.
  const std::int64_t m = shapes_ok ? x.shape[0] : 0, k = shapes_ok ? x.shape[1] : 0, rows = shapes_ok ? w.shape[0] : 0;
  const bool fuse_norm = (skinny_fuse_ & (swiglu ? 4 : 1)) != 0, fuse_swiglu = swiglu && (skinny_fuse_ & 2) != 0;
  // The partial fusions (for comparisons) keep an intermediate in the caller's scratch.
  const bool scratch_ok = (!swiglu || fuse_swiglu) ? (fuse_norm || h_scratch.shape == x.shape)
                                                 : y_scratch.shape == Shape{m, rows} && y_scratch.dtype == dt;
  if (shapes_ok && dtypes_ok && scratch_ok && fuse_norm &&
      skinny_norm_gemm_supported(dt, m, rows, k, x.data, norm_weight.data, w.data, skinny_fuse_rows_)) {
    const std::size_t bytes = skinny_norm_scratch_bytes(k);
    if (!skinny_block_stats_ && skinny_norm_scratch_.size() < bytes) {
      ensure_scratch(skinny_norm_scratch_, bytes);
      XSERV_CUDA_CHECK(cudaMemsetAsync(skinny_norm_scratch_.data(), 0, skinny_norm_scratch_.size(), stream_));
    }
    void* stats = skinny_block_stats_ ? nullptr : skinny_norm_scratch_.data();
    if (swiglu && !fuse_swiglu) {  // XSERV_CUDA_SKINNY_FUSE=4: the norm alone
      launch_skinny_norm_gemm(stream_, y_scratch.data, x.data, norm_weight.data, eps, w.data, false, m, rows, k,
                              sm_count_, stats);
      this->swiglu(out, y_scratch);
      return;
    }
    launch_skinny_norm_gemm(stream_, out.data, x.data, norm_weight.data, eps, w.data, swiglu, m, rows, k,
                            sm_count_, stats, skinny_next);
    return;
  }
  if (shapes_ok && dtypes_ok && scratch_ok && fuse_swiglu && !fuse_norm &&
      skinny_gemm_supported(dt, m, rows, k, x.data, w.data, skinny_fuse_rows_)) {  // the SwiGLU alone
    rms_norm(h_scratch, x, {}, norm_weight, eps);
    launch_skinny_norm_gemm(stream_, out.data, h_scratch.data, nullptr, eps, w.data, true, m, rows, k, sm_count_,
                            nullptr, skinny_next);
    return;
  }
  // Larger batches, and bad shapes or dtypes, which the separate ops reject naming the op.
  Backend::rms_norm_gemm(out, x, norm_weight, eps, w, swiglu, h_scratch, y_scratch);
}

void CudaBackend::gemm_rms_norm_gemm(Tensor x, const Tensor& a, const Tensor& w_res, const Tensor& norm_weight,
                                     float eps, const Tensor& w, bool swiglu, Tensor out, Tensor h_scratch,
                                     Tensor y_scratch) {
  const Tensor next_weight = std::exchange(next_weight_, Tensor{});  // the hint holds for this op only
  const DType dt = x.dtype;
  const bool ranks_ok = x.shape.rank() == 2 && a.shape.rank() == 2 && w_res.shape.rank() == 2 &&
                        w.shape.rank() == 2 && out.shape.rank() == 2;
  const std::int64_t m = ranks_ok ? x.shape[0] : 0, n = ranks_ok ? x.shape[1] : 0, k = ranks_ok ? a.shape[1] : 0;
  const std::int64_t rows = ranks_ok ? w.shape[0] : 0;
  int splits = resid_splits_;
  if (resid_part_k_ > 0) {  // the most parts of at least ~resid_part_k_ that divide K evenly
    splits = static_cast<int>(std::clamp<std::int64_t>((k + resid_part_k_ / 2) / resid_part_k_, 1, 8));
    while (splits > 1 && k % (8 * splits) != 0) --splits;
  }
  // Past the rows whose GEMMs run the GEMV or the skinny kernel (those fold the norm otherwise).
  const bool take = splits > 0 && ranks_ok && dt == DType::bf16 && a.dtype == dt &&
                    w_res.dtype == dt && norm_weight.dtype == dt && w.dtype == dt && out.dtype == dt &&
                    a.shape[0] == m && w_res.shape[0] == n && w_res.shape[1] == k && norm_weight.numel() == n &&
                    w.shape[1] == n && h_scratch.shape == x.shape && h_scratch.dtype == dt && out.shape[0] == m &&
                    out.shape[1] == (swiglu ? rows / 2 : rows) &&
                    (!swiglu || (rows % 2 == 0 && y_scratch.shape == Shape{m, rows} && y_scratch.dtype == dt)) &&
                    m > std::max<std::int64_t>(skinny_rows_, skinny_fuse_rows_) && m > 8 && m <= resid_max_rows &&
                    k % (8 * splits) == 0 &&
                    residual_rms_norm_supported(n, x.data, h_scratch.data, norm_weight.data);
  if (!take) {
    // As Backend::gemm_rms_norm_gemm: the residual GEMM, then the norm GEMV. Ahead of the SwiGLU
    // GEMV (the o_proj, then RMSNorm + gate|up + SwiGLU) the one-row GEMVs may be told so
    // (XSERV_CUDA_GEMV_EARLY_TRIGGER bit 4, XSERV_CUDA_GEMV_SWIGLU_PDL_MB: GemvTuning says why).
    // The o_proj may also ask the gate|up's first MB into L2, the gate rows' and the up rows'
    // first (XSERV_CUDA_GEMV_L2_NEXT_MB: GemvTuning::l2_next_mb says where and why).
    GemvChain res_chain, norm_chain;
    if (swiglu) {
      const GemvTuning& tune = gemv_tuning();
      res_chain.trigger_early = (tune.early_trigger & 4) != 0;
      if (tune.swiglu_pdl_mb > 0) norm_chain.pdl_max_bytes = std::int64_t{tune.swiglu_pdl_mb} << 20;
      const std::int64_t w_bytes = ranks_ok ? rows * w.shape[1] * static_cast<std::int64_t>(dtype_size(w.dtype)) : 0;
      std::int64_t l2_bytes = 0;
      if (tune.l2_next_mb > 0) {
        l2_bytes = std::int64_t{tune.l2_next_mb} << 20;
      } else if (tune.l2_next_mb < 0 && dram_peak_ > 0 && dram_peak_ < gemv_l2_next_max_dram &&
                 !gemv_launches_pdl(w_bytes, norm_chain)) {  // the default rule
        l2_bytes = std::int64_t{6} << 20;
        res_chain.l2_next_if_held = true;
      }
      if (l2_bytes > 0 && rows % 2 == 0) {
        res_chain.l2_next = w.data;
        res_chain.l2_next_bytes = std::min(w_bytes / 2, l2_bytes / 2);
        res_chain.l2_next_second = w_bytes / 2;
      }
    }
    // At 5-32 rows the SwiGLU GEMM may ask the first MB of the op after this one (the down_proj,
    // Backend::prefetch_next) into L2 once its loads are done (opt-in, XSERV_CUDA_SKINNY_L2_NEXT_MB=N:
    // the 16-warp blocks of that skinny GEMM become resident only as the SwiGLU GEMM's leave).
    L2Prefetch skinny_next;
    if (swiglu && skinny_l2_next_mb_ > 0 && !next_weight.empty() &&
        reinterpret_cast<std::uintptr_t>(next_weight.data) % 16 == 0)
      skinny_next = {next_weight.data, std::min<std::int64_t>(std::int64_t{skinny_l2_next_mb_} << 20,
                                                              static_cast<std::int64_t>(next_weight.bytes()))};
    gemm_chained(x, a, w_res, WeightLayout::out_in, {}, 1.0f, 0, res_chain);
    rms_norm_gemm_chained(out, x, norm_weight, eps, w, swiglu, h_scratch, y_scratch, norm_chain, skinny_next);
    return;
  }
  // Sized for the largest rows at once, so graph captures of smaller batches never grow it.
  ensure_scratch(resid_partials_, static_cast<std::size_t>(splits) * resid_max_rows * n * sizeof(float));
  auto* partials = static_cast<float*>(resid_partials_.data());
  gemm_->run_split_k(dt, partials, a.data, w_res.data, m, n, k, splits);
  launch_residual_rms_norm(stream_, dt, x.data, h_scratch.data, partials, splits, norm_weight.data, eps, m, n);
  if (!swiglu) {
    gemm(out, h_scratch, w, WeightLayout::out_in, Tensor(), 0.0f, 0);
    return;
  }
  gemm(y_scratch, h_scratch, w, WeightLayout::out_in, Tensor(), 0.0f, 0);
  this->swiglu(out, y_scratch);
}

bool CudaBackend::fuses_rms_norm_mlp(const Tensor& x, const Tensor& gate_up_w, const Tensor& down_w) const noexcept {
  if (!fuse_mlp_ || !use_gemv_ || x.shape.rank() != 2 || gate_up_w.shape.rank() != 2 || down_w.shape.rank() != 2)
    return false;
  const std::int64_t n = x.shape[1], inter = down_w.shape[1];
  return gate_up_w.shape[0] == 2 * inter && gate_up_w.shape[1] == n && down_w.shape[0] == n &&
         gate_up_w.dtype == x.dtype && down_w.dtype == x.dtype &&
         mlp_fused_supported(x.dtype, x.shape[0], n, inter, x.data, gate_up_w.data, down_w.data, sm_count_);
}

void CudaBackend::rms_norm_mlp(Tensor x, const Tensor& norm_weight, float eps, const Tensor& gate_up_w,
                               const Tensor& down_w, Tensor act_scratch, Tensor h_scratch, Tensor y_scratch) {
  if (!fuses_rms_norm_mlp(x, gate_up_w, down_w) || norm_weight.dtype != x.dtype || norm_weight.numel() != x.shape[1] ||
      reinterpret_cast<std::uintptr_t>(norm_weight.data) % 16 != 0) {
    Backend::rms_norm_mlp(x, norm_weight, eps, gate_up_w, down_w, act_scratch, h_scratch, y_scratch);
    return;
  }
  const std::int64_t n = x.shape[1], inter = down_w.shape[1];
  ensure_scratch(mlp_partials_, mlp_fused_partial_floats(n, inter, sm_count_) * sizeof(float));
  if (mlp_tickets_.size() < mlp_fused_tickets * sizeof(unsigned)) {
    ensure_scratch(mlp_tickets_, mlp_fused_tickets * sizeof(unsigned));
    XSERV_CUDA_CHECK(cudaMemsetAsync(mlp_tickets_.data(), 0, mlp_tickets_.size(), stream_));
  }
  launch_mlp_fused(stream_, x.data, norm_weight.data, eps, gate_up_w.data, down_w.data, n, inter,
                   static_cast<float*>(mlp_partials_.data()), static_cast<unsigned*>(mlp_tickets_.data()), sm_count_,
                   mlp_stages_);
}

QkTransformParams CudaBackend::qk_params(const Tensor& qkv, const HeadGeometry& heads,
                                         const QkTransform& t, const DeviceBatch& batch,
                                         const KvLayer& cache) const {
  const DType dt = qkv.dtype;
  const std::int64_t rows = qkv.shape[0];
  XSERV_CHECK(is_act(dt) && qkv.shape.rank() == 2 && qkv.shape[1] == heads.qkv_width() &&
                  rows == batch.num_tokens && cache.k.dtype == dt && cache.v.dtype == dt &&
                  cache.k.shape.rank() == 4 && cache.k.shape[2] == heads.n_kv_heads &&
                  cache.k.shape[3] == heads.head_dim && heads.head_dim <= max_head_dim &&
                  heads.head_dim % 2 == 0 &&
                  (t.q_norm.empty() || (t.q_norm.dtype == dt && t.q_norm.numel() == heads.head_dim)) &&
                  (t.k_norm.empty() || (t.k_norm.dtype == dt && t.k_norm.numel() == heads.head_dim)),
              ErrorCode::invalid_argument,
              "qk_transform_store: qkv {} ({}) with {}+2x{} heads of {}, cache {} ({}) do not fit",
              qkv.shape, dtype_name(dt), heads.n_q_heads, heads.n_kv_heads, heads.head_dim,
              cache.k.shape, dtype_name(cache.k.dtype));
  QkTransformParams p;
  p.qkv = qkv.data;
  p.qkv_stride = qkv.shape[1];
  p.q_norm = t.q_norm.empty() ? nullptr : t.q_norm.data;
  p.k_norm = t.k_norm.empty() ? nullptr : t.k_norm.data;
  p.norm_eps = t.norm_eps;
  p.rope = t.rope;
  p.positions = batch.positions.as<std::int32_t>();
  p.slot_mapping = batch.slot_mapping.as<std::int32_t>();
  p.k_cache = cache.k.data;
  p.v_cache = cache.v.data;
  p.rows = static_cast<std::int32_t>(rows);
  p.n_q_heads = heads.n_q_heads;
  p.n_kv_heads = heads.n_kv_heads;
  p.head_dim = heads.head_dim;
  if (t.rope) {
    // As HF: inv_freq = 1 / theta^(2i / d) in f32.
    for (int i = 0; i < heads.head_dim / 2; ++i)
      p.inv_freq[i] = 1.0f / std::pow(t.rope_theta, static_cast<float>(2 * i) / static_cast<float>(heads.head_dim));
  }
  return p;
}

void CudaBackend::qk_transform_store(Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                                     const DeviceBatch& batch, KvLayer cache) {
  launch_qk_transform_store(stream_, qkv.dtype, qk_params(qkv, heads, t, batch, cache));
}

AttentionParams CudaBackend::attention_params(const Tensor& out, const Tensor& qkv,
                                              const HeadGeometry& heads, const DeviceBatch& batch,
                                              const KvLayer& cache, float scale) const {
  const DType dt = qkv.dtype;
  XSERV_CHECK(heads.n_kv_heads > 0 && heads.n_q_heads % heads.n_kv_heads == 0 &&
                  qkv.shape.rank() == 2 && qkv.shape[1] == heads.qkv_width() &&
                  qkv.shape[0] == batch.num_tokens && out.dtype == dt &&
                  out.numel() == static_cast<std::int64_t>(batch.num_tokens) * heads.n_q_heads * heads.head_dim &&
                  cache.k.dtype == dt && cache.k.shape.rank() == 4 &&
                  cache.k.shape[2] == heads.n_kv_heads && cache.k.shape[3] == heads.head_dim,
              ErrorCode::invalid_argument,
              "attention: out {}, qkv {} ({}), {}/{} heads of {}, cache {} do not fit", out.shape,
              qkv.shape, dtype_name(dt), heads.n_q_heads, heads.n_kv_heads, heads.head_dim,
              cache.k.shape);
  AttentionParams p;
  p.out = out.data;
  p.qkv = qkv.data;
  p.qkv_stride = qkv.shape[1];
  p.k_cache = cache.k.data;
  p.v_cache = cache.v.data;
  p.query_start = batch.query_start.as<std::int32_t>();
  p.context_lens = batch.context_lens.as<std::int32_t>();
  p.block_tables = batch.block_tables.as<std::int32_t>();
  p.num_tokens = batch.num_tokens;
  p.num_seqs = batch.num_seqs;
  p.max_query_len = batch.max_query_len;
  p.max_context_len = batch.max_context_len;
  p.max_blocks_per_seq = batch.max_blocks_per_seq;
  p.block_size = cache.block_size();
  p.n_q_heads = heads.n_q_heads;
  p.n_kv_heads = heads.n_kv_heads;
  p.head_dim = heads.head_dim;
  p.scale = scale;
  return p;
}

void CudaBackend::set_attention_splits(AttentionParams& p, DType dt, const DeviceBatch& batch) {
  // Splits are sized from the power-of-two bucket of the longest context, not the context itself,
  // so a recorded graph covers every context up to its bucket.
  const std::int32_t bucket = std::max(256, next_pow2(batch.max_context_len));
  const AttentionSplit split = attention_rows_split(
      dt, p.head_dim, p.n_q_heads / p.n_kv_heads,
      static_cast<std::int64_t>(p.num_tokens) * p.n_kv_heads, bucket, sm_count_);
  const std::int32_t splits = split.num_splits;
  p.num_splits = splits;
  p.split_size = split.split_size;
  if (splits > 1) {
    const std::size_t parts = static_cast<std::size_t>(p.num_tokens) * p.n_q_heads * splits;
    const std::size_t bytes = parts * (static_cast<std::size_t>(p.head_dim) + 2) * sizeof(float);
    ensure_scratch(split_scratch_, bytes);
    p.partial_out = static_cast<float*>(split_scratch_.data());
    p.partial_ml = p.partial_out + parts * p.head_dim;
  }
  // Sized at every call, split or not, so the largest batch of warm-up allocates what any later
  // graph capture needs.
  const std::size_t ticket_bytes = static_cast<std::size_t>(p.num_tokens) * p.n_kv_heads * sizeof(unsigned);
  if (attention_tickets_.size() < ticket_bytes) {
    ensure_scratch(attention_tickets_, ticket_bytes);
    XSERV_CUDA_CHECK(cudaMemsetAsync(attention_tickets_.data(), 0, attention_tickets_.size(), stream_));
  }
  p.tickets = static_cast<unsigned*>(attention_tickets_.data());
}

void CudaBackend::attention(Tensor out, const Tensor& qkv, const HeadGeometry& heads,
                            const DeviceBatch& batch, const KvLayer& cache, float scale) {
  const DType dt = qkv.dtype;
  AttentionParams p = attention_params(out, qkv, heads, batch, cache, scale);
  if (p.num_tokens == 0) return;
  if (batch.max_query_len > 1 && attention_prefill_supported(dt, heads.head_dim)) {
    launch_attention_prefill(stream_, dt, p);
    return;
  }
  XSERV_CHECK(attention_rows_supported(heads.head_dim, heads.n_q_heads / heads.n_kv_heads),
              ErrorCode::unsupported, "attention: head_dim {} with {} q heads per kv head",
              heads.head_dim, heads.n_q_heads / heads.n_kv_heads);
  set_attention_splits(p, dt, batch);
  launch_attention_rows(stream_, dt, p);
}

// How much of the next op's weight (prefetch_next) the folded decode attention asks into L2
// after its wait (XSERV_CUDA_ATTN_L2_NEXT_MB, read at every call, so at a graph's recording).
// By default (`auto`): where that op is a skinny tensor-core GEMM (5..32 rows), whose 16-warp
// blocks cannot become resident beside the attention's to start their weights before its end
// (one-row GEMVs, fed through PDL and their bulk rings, already do), all of it up to 3/4 of the
// L2 cache: serving Qwen3-8B 16 at once on an H200 +0.4% (a step 4571 -> 4553 us), 1.7B +0.1%
// (docs/benchmarks.md, "The next op's weight into L2 during batched decode"). N asks N MB wherever the hint is
// given, 0 nothing. Only the one-pass short-context kernel acts on it.
std::int64_t CudaBackend::attention_l2_next_bytes(const Tensor& w, std::int64_t rows) const {
  if (w.empty() || reinterpret_cast<std::uintptr_t>(w.data) % 16 != 0) return 0;
  const char* env = std::getenv("XSERV_CUDA_ATTN_L2_NEXT_MB");
  const std::int64_t bytes = static_cast<std::int64_t>(w.bytes());
  std::int64_t ask = 0;
  if (env == nullptr || std::string_view(env) == "auto") {
    if (rows > max_gemv_rows && rows <= max_skinny_gemm_rows) ask = l2_bytes_ / 4 * 3;
  } else {
    ask = std::int64_t{std::max(0, std::atoi(env))} << 20;
  }
  return std::min(ask, bytes) & ~std::int64_t{15};
}

void CudaBackend::qk_attention(Tensor out, Tensor qkv, const HeadGeometry& heads,
                               const QkTransform& t, const DeviceBatch& batch, KvLayer cache,
                               float scale) {
  const Tensor next_weight = std::exchange(next_weight_, Tensor{});  // the hint holds for this op only
  const std::int32_t group = heads.n_kv_heads > 0 ? heads.n_q_heads / heads.n_kv_heads : 0;
  const std::int32_t bucket = std::max(256, next_pow2(batch.max_context_len));
  // The split mma decode kernel with the prologue folded in: few rows over a short context
  // (short_context_decode), or every decode step with XSERV_CUDA_ATTN_FUSE_QK=1. Decided from
  // the graph key's shape (rows, the longest query, the context bucket) alone, so a recording
  // always holds the same kernels.
  if (group > 0 && heads.n_q_heads % heads.n_kv_heads == 0 &&
      qk_attention_mma_supported(qkv.dtype, heads.head_dim, group, batch.max_query_len,
                                 static_cast<std::int64_t>(batch.num_tokens) * heads.n_kv_heads,
                                 bucket, sm_count_)) {
    QkAttentionParams p{attention_params(out, qkv, heads, batch, cache, scale),
                        qk_params(qkv, heads, t, batch, cache)};
    if (p.attn.num_tokens == 0) return;
    set_attention_splits(p.attn, qkv.dtype, batch);
    const std::int64_t ask = attention_l2_next_bytes(next_weight, batch.num_tokens);
    if (ask > 0) p.l2_next = {next_weight.data, ask};
    launch_qk_attention_mma(stream_, p);
    return;
  }
  // Decode without a q/k transform (GPT-2) on the register kernel (f32): the attention kernel
  // writes the step's k and v into the cache itself, one kernel fewer a layer.
  if (batch.max_query_len == 1 && t.q_norm.empty() && t.k_norm.empty() && !t.rope &&
      fuse_store_kv_ && attention_rows_store_kv(qkv.dtype, heads.head_dim) &&
      attention_rows_supported(heads.head_dim, group) && group > 0 && heads.n_q_heads % heads.n_kv_heads == 0) {
    AttentionParams p = attention_params(out, qkv, heads, batch, cache, scale);
    if (p.num_tokens == 0) return;
    set_attention_splits(p, qkv.dtype, batch);
    p.store_kv = true;
    launch_attention_rows(stream_, qkv.dtype, p);
    return;
  }
  qk_transform_store(qkv, heads, t, batch, cache);
  attention(out, qkv, heads, batch, cache, scale);
}

void CudaBackend::gelu(Tensor x) {
  XSERV_CHECK(is_act(x.dtype), ErrorCode::invalid_argument, "gelu: dtype {}", dtype_name(x.dtype));
  launch_gelu(stream_, x.dtype, x.data, x.numel());
}

void CudaBackend::swiglu(Tensor out, const Tensor& gate_up) {
  XSERV_CHECK(is_act(out.dtype) && gate_up.dtype == out.dtype && out.shape.rank() == 2 &&
                  gate_up.shape.rank() == 2 && gate_up.shape[0] == out.shape[0] &&
                  gate_up.shape[1] == 2 * out.shape[1],
              ErrorCode::invalid_argument, "swiglu: out {} and gate_up {} do not fit", out.shape,
              gate_up.shape);
  launch_swiglu(stream_, out.dtype, out.data, gate_up.data, out.shape[0], out.shape[1]);
}

void CudaBackend::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  XSERV_CHECK(is_act(x.dtype) && out.dtype == x.dtype && rows.dtype == DType::i32 &&
                  x.shape.rank() == 2 && out.shape.rank() == 2 && out.shape[1] == x.shape[1] &&
                  out.shape[0] == rows.numel(),
              ErrorCode::invalid_argument, "gather_rows: out {}, x {}, rows {} do not fit",
              out.shape, x.shape, rows.shape);
  launch_gather_rows(stream_, x.dtype, out.data, x.data, rows.as<std::int32_t>(), rows.numel(),
                     x.shape[1]);
}

void CudaBackend::sample(Tensor logits, const SamplingBatch& params, std::int32_t* out_ids) {
  if (logits.shape.rank() == 2 && logits.shape[0] == 0) return;
  wait_slot(enqueue_sample(logits, params, nullptr), out_ids);
}

std::uint64_t CudaBackend::sample_async(Tensor logits, const SamplingBatch& params, Tensor ids_out) {
  XSERV_CHECK(ids_out.dtype == DType::i32 && logits.shape.rank() == 2 &&
                  ids_out.numel() == logits.shape[0] && logits.shape[0] > 0,
              ErrorCode::invalid_argument, "sample_async: ids_out {} ({}) for logits {}",
              ids_out.shape, dtype_name(ids_out.dtype), logits.shape);
  return enqueue_sample(logits, params, ids_out.as<std::int32_t>()) + 1;
}

void CudaBackend::wait_sampled(std::uint64_t ticket, std::int32_t* out_ids) {
  XSERV_CHECK(ticket >= 1 && ticket <= sample_slots_.size() && sample_slots_[ticket - 1]->busy,
              ErrorCode::invalid_argument, "wait_sampled: unknown ticket {}", ticket);
  wait_slot(static_cast<std::size_t>(ticket - 1), out_ids);
}

void CudaBackend::wait_slot(std::size_t slot, std::int32_t* out_ids) {
  SampleSlot& sl = *sample_slots_[slot];
  const cudaError_t status = cudaEventSynchronize(sl.done);
  sl.busy = false;  // the copies are over (or the stream failed: the slot holds nothing then)
  XSERV_CUDA_CHECK(status);
  close_profile_range();
  std::memcpy(out_ids, sl.host.data() + sl.ids_offset, static_cast<std::size_t>(sl.rows) * 4);
}

void CudaBackend::resolve_tokens(Tensor tokens, const Tensor& sampled) {
  XSERV_CHECK(tokens.dtype == DType::i32 && sampled.dtype == DType::i32 &&
                  tokens.shape.rank() == 1 && sampled.shape.rank() == 1,
              ErrorCode::invalid_argument, "resolve_tokens: tokens {} ({}), sampled {} ({})",
              tokens.shape, dtype_name(tokens.dtype), sampled.shape, dtype_name(sampled.dtype));
  launch_resolve_tokens(stream_, tokens.as<std::int32_t>(), tokens.numel(),
                        sampled.as<std::int32_t>());
}

std::size_t CudaBackend::enqueue_sample(Tensor logits, const SamplingBatch& params,
                                        std::int32_t* ids_out) {
  XSERV_CHECK(logits.dtype == DType::f32 && logits.shape.rank() == 2 &&
                  static_cast<std::size_t>(logits.shape[0]) == params.rows.size(),
              ErrorCode::invalid_argument, "sample: logits {} ({}) for {} rows", logits.shape,
              dtype_name(logits.dtype), params.rows.size());
  const auto rows = static_cast<std::int32_t>(logits.shape[0]);
  const std::int64_t vocab = logits.shape[1];
  XSERV_CHECK(vocab > 0 && vocab < (std::int64_t{1} << 31), ErrorCode::invalid_argument,
              "sample: vocab of {}", vocab);
  bool penalties = false;
  std::vector<SamplingRowParams> prm(static_cast<std::size_t>(rows));
  for (std::int32_t r = 0; r < rows; ++r) {
    const SamplingRow& s = params.rows[static_cast<std::size_t>(r)];
    const bool pen = s.repetition_penalty != 1.0f || s.presence_penalty != 0.0f || s.frequency_penalty != 0.0f;
    penalties = penalties || pen;
    prm[static_cast<std::size_t>(r)] = SamplingRowParams{
        s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty, s.presence_penalty,
        s.frequency_penalty, sampling_uniform(s.seed, s.step), pen ? 1 : 0};
  }
  const bool has_prompt = penalties && params.prompt_start.size() == static_cast<std::size_t>(rows) + 1;
  const bool has_output = penalties && params.output_start.size() == static_cast<std::size_t>(rows) + 1;
  auto check_tokens = [&](const std::vector<std::int32_t>& toks, const std::vector<std::int32_t>& start,
                          const char* what) {
    XSERV_CHECK(start.front() == 0 && static_cast<std::size_t>(start.back()) == toks.size() &&
                    std::is_sorted(start.begin(), start.end()),
                ErrorCode::invalid_argument, "sample: {} offsets are inconsistent", what);
    for (auto tok : toks)
      XSERV_CHECK(tok >= 0 && tok < vocab, ErrorCode::invalid_argument,
                  "sample: {} token {} is outside the vocab of {}", what, tok, vocab);
  };
  if (has_prompt) check_tokens(params.prompt_tokens, params.prompt_start, "prompt");
  if (has_output) check_tokens(params.output_tokens, params.output_start, "output");

  // One pinned block and one copy: [params | ids | prompt tokens | starts | output tokens | starts].
  const std::size_t prm_bytes = round_up(prm.size() * sizeof(SamplingRowParams), 256);
  const std::size_t ids_bytes = round_up(static_cast<std::size_t>(rows) * 4, 256);
  auto ints = [](std::size_t n) { return round_up(n * 4, 256); };
  const std::size_t pt = has_prompt ? ints(params.prompt_tokens.size()) : 0;
  const std::size_t ps = has_prompt ? ints(params.prompt_start.size()) : 0;
  const std::size_t ot = has_output ? ints(params.output_tokens.size()) : 0;
  const std::size_t os = has_output ? ints(params.output_start.size()) : 0;
  const std::size_t total = prm_bytes + ids_bytes + pt + ps + ot + os;
  // A free staging slot (two are busy at most while steps overlap).
  std::size_t slot = 0;
  while (slot < sample_slots_.size() && sample_slots_[slot]->busy) ++slot;
  if (slot == sample_slots_.size()) {
    auto sl = std::make_unique<SampleSlot>();
    XSERV_CUDA_CHECK(cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming));
    sample_slots_.push_back(std::move(sl));
  }
  SampleSlot& sl = *sample_slots_[slot];
  if (sl.host.size() < total) sl.host = PinnedBuffer(round_up(total * 2, 1 << 16));
  const void* device_before = sample_device_.data();
  ensure_scratch(sample_device_, total);
  // An overlapped step's copies take the side stream, unless the inputs' device buffer was just
  // reallocated (its new memory is known free in the forward's stream order only).
  const bool side = copy_stream_ != nullptr && ids_out != nullptr && sample_device_.data() == device_before;
  char* h = sl.host.data();
  auto* d = static_cast<char*>(sample_device_.data());
  std::memcpy(h, prm.data(), prm.size() * sizeof(SamplingRowParams));
  std::size_t off = prm_bytes + ids_bytes;
  auto put = [&](const std::vector<std::int32_t>& v, std::size_t bytes) {
    const std::size_t at = off;
    if (bytes) std::memcpy(h + at, v.data(), v.size() * 4);
    off += bytes;
    return reinterpret_cast<const std::int32_t*>(d + at);
  };
  const std::int32_t* prompt_tokens = put(params.prompt_tokens, pt);
  const std::int32_t* prompt_start = put(params.prompt_start, ps);
  const std::int32_t* output_tokens = put(params.output_tokens, ot);
  const std::int32_t* output_start = put(params.output_start, os);
  if (side) {
    // After the kernels that read the previous inputs; the sampling kernels wait for the copy.
    XSERV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, sampling_done_));
    XSERV_CUDA_CHECK(cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, copy_stream_));
    XSERV_CUDA_CHECK(cudaEventRecord(params_ready_, copy_stream_));
    XSERV_CUDA_CHECK(cudaStreamWaitEvent(stream_, params_ready_));
  } else {
    if (copy_stream_) {
      // Side copies still pending read the ids buffer these kernels may overwrite.
      XSERV_CUDA_CHECK(cudaEventRecord(params_ready_, copy_stream_));
      XSERV_CUDA_CHECK(cudaStreamWaitEvent(stream_, params_ready_));
    }
    XSERV_CUDA_CHECK(cudaMemcpyAsync(d, h, total, cudaMemcpyHostToDevice, stream_));
  }
  std::uint32_t* counts = nullptr;
  if (penalties) {
    ensure_scratch(token_counts_, static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab) * 4);
    counts = static_cast<std::uint32_t*>(token_counts_.data());
    launch_token_counts(stream_, counts, vocab, rows, has_prompt ? prompt_tokens : nullptr,
                        has_prompt ? prompt_start : nullptr, has_output ? output_tokens : nullptr,
                        has_output ? output_start : nullptr);
  }
  auto* ids_dev = ids_out ? ids_out : reinterpret_cast<std::int32_t*>(d + prm_bytes);
  // Rows that are all greedy or small-top-k (chat defaults: Qwen3 samples with top_k 20) take
  // the split-row path; one row without a top-k sends the batch to the one-block-per-row kernel.
  int k_max = 1;
  for (const SamplingRow& s : params.rows) {
    const int k = s.temperature <= 0.0f ? 1 : (s.top_k > 0 ? s.top_k : sample_topk_max_k + 1);
    k_max = std::max(k_max, k);
  }
  if (k_max <= sample_topk_max_k) {
    ensure_scratch(sample_candidates_, static_cast<std::size_t>(rows) *
                                           static_cast<std::size_t>(sample_topk_candidates(vocab, k_max, rows)) * 8);
    unsigned* tickets = nullptr;
    if (sample_one_pass_ && k_max == 1) {
      const std::size_t bytes = static_cast<std::size_t>(rows) * sizeof(unsigned);
      if (sample_tickets_.size() < bytes) {
        ensure_scratch(sample_tickets_, bytes);
        XSERV_CUDA_CHECK(cudaMemsetAsync(sample_tickets_.data(), 0, sample_tickets_.size(), stream_));
      }
      tickets = static_cast<unsigned*>(sample_tickets_.data());
    }
    launch_sample_topk(stream_, logits.as<float>(), rows, vocab, reinterpret_cast<const SamplingRowParams*>(d),
                       counts, k_max, sample_candidates_.data(), tickets, ids_dev);
  } else {
    int filters = 1;  // the draw, then top-k (past the split path's limit) and top-p where set
    for (const SamplingRow& s : params.rows)
      if (s.temperature > 0.0f)
        filters = std::max(filters, 1 + (s.top_k > 0 && s.top_k < vocab ? 1 : 0) + (s.top_p < 1.0f ? 1 : 0));
    ensure_scratch(sample_select_, sample_select_bytes(rows));
    launch_sample(stream_, logits.as<float>(), rows, vocab, reinterpret_cast<const SamplingRowParams*>(d),
                  8 * filters, counts, sample_select_.data(), ids_dev);
  }
  if (copy_stream_) XSERV_CUDA_CHECK(cudaEventRecord(sampling_done_, stream_));
  // With side copies the next step's graph follows the sampling kernels at once; the ids come
  // down beside it.
  cudaStream_t ids_stream = side ? copy_stream_ : stream_;
  if (side) XSERV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, sampling_done_));
  XSERV_CUDA_CHECK(cudaMemcpyAsync(h + prm_bytes, ids_dev, static_cast<std::size_t>(rows) * 4,
                                   cudaMemcpyDeviceToHost, ids_stream));
  XSERV_CUDA_CHECK(cudaEventRecord(sl.done, ids_stream));
  sl.ids_offset = prm_bytes;
  sl.rows = rows;
  sl.busy = true;
  return slot;
}

void CudaBackend::logprobs(const Tensor& logits, const std::int32_t* ids, std::int32_t top_n,
                           float* out_logprobs, std::int32_t* out_top_ids,
                           float* out_top_logprobs) {
  XSERV_CHECK(logits.dtype == DType::f32 && logits.shape.rank() == 2 && logits.shape[1] > 0,
              ErrorCode::invalid_argument, "logprobs: logits {} ({}), expected [rows, vocab] f32",
              logits.shape, dtype_name(logits.dtype));
  XSERV_CHECK(top_n >= 0 && top_n <= max_top_logprobs, ErrorCode::invalid_argument,
              "logprobs: top_n = {} (expected 0 ..= {})", top_n, max_top_logprobs);
  const auto rows = static_cast<std::int32_t>(logits.shape[0]);
  const std::int64_t vocab = logits.shape[1];
  if (rows == 0) return;
  for (std::int32_t r = 0; r < rows; ++r)
    XSERV_CHECK(ids[r] >= 0 && ids[r] < vocab, ErrorCode::invalid_argument,
                "logprobs: token {} is outside the vocabulary of {}", ids[r], vocab);
  // One pinned block both ways: [ids | chosen | top ids | top logprobs].
  const auto n = static_cast<std::size_t>(rows);
  const std::size_t top = n * static_cast<std::size_t>(top_n);
  const std::size_t ids_bytes = round_up(n * 4, 256), chosen_bytes = round_up(n * 4, 256);
  const std::size_t top_bytes = round_up(top * 4, 256);
  const std::size_t total = ids_bytes + chosen_bytes + 2 * top_bytes;
  if (logprobs_host_.size() < total) logprobs_host_ = PinnedBuffer(round_up(total * 2, 1 << 16));
  ensure_scratch(logprobs_device_, total);
  char* h = logprobs_host_.data();
  auto* d = static_cast<char*>(logprobs_device_.data());
  std::memcpy(h, ids, n * 4);
  XSERV_CUDA_CHECK(cudaMemcpyAsync(d, h, n * 4, cudaMemcpyHostToDevice, stream_));
  launch_logprobs(stream_, logits.as<float>(), rows, vocab,
                  reinterpret_cast<const std::int32_t*>(d), top_n,
                  reinterpret_cast<float*>(d + ids_bytes),
                  reinterpret_cast<std::int32_t*>(d + ids_bytes + chosen_bytes),
                  reinterpret_cast<float*>(d + ids_bytes + chosen_bytes + top_bytes));
  XSERV_CUDA_CHECK(cudaMemcpyAsync(h + ids_bytes, d + ids_bytes, total - ids_bytes,
                                   cudaMemcpyDeviceToHost, stream_));
  XSERV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(out_logprobs, h + ids_bytes, n * 4);
  if (top > 0) {
    std::memcpy(out_top_ids, h + ids_bytes + chosen_bytes, top * 4);
    std::memcpy(out_top_logprobs, h + ids_bytes + chosen_bytes + top_bytes, top * 4);
  }
}

void CudaBackend::run_graph(std::uint64_t key, const std::function<void()>& ops) {
  const auto [t, s, r, q, bucket, stride] = batch_shape_;
  const GraphKey k{key, t, s, r, q, bucket, stride};
  Graph& g = graphs_[k];
  if (g.exec) {
    // XSERV_CUDA_PROFILE_REPLAY=N: the N-th replay of each recording runs between
    // cudaProfilerStart and Stop, so `ncu --profile-from-start off` times the kernels of exactly
    // one decode step per batch shape (scripts/cuda_device_run.sh profile).
    static const int profile_replay = [] {
      const char* env = std::getenv("XSERV_CUDA_PROFILE_REPLAY");
      return env ? std::atoi(env) : 0;
    }();
    // The range stays open through the sampling that follows (sample() or synchronize()
    // closes it), so the step's lm_head, sampling kernels and copies are in the profile too.
    close_profile_range();
    const bool profile = ++g.replays == profile_replay;
    if (g.prepares) kept_prepared_ = true;
    if (profile) {
      XSERV_CUDA_CHECK(cudaStreamSynchronize(stream_));
      XSERV_CUDA_CHECK(cudaProfilerStart());
      profile_open_ = true;
    }
    XSERV_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
    return;
  }
  if (!g.warmed) {
    ops();
    // ops may have grown scratch (which clears graphs_, this entry included): look it up again.
    graphs_[k].warmed = true;
    return;
  }
  XSERV_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  capture_prepares_ = false;
  cudaGraph_t graph = nullptr;
  try {
    ops();
  } catch (...) {
    capturing_ = false;
    kept_valid_ = false;  // a prepare_decode recorded here never runs
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  capturing_ = false;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (ended != cudaSuccess) kept_valid_ = false;
  XSERV_CUDA_CHECK(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (status != cudaSuccess) kept_valid_ = false;
  XSERV_CUDA_CHECK(status);
  g.exec = exec;
  g.prepares = capture_prepares_;
  XSERV_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

bool device_available() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace xserv::cuda
