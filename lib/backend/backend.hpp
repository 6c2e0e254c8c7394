// The Backend interface: every op a model forward needs, at the granularity performance needs.
//
// Models (lib/models) are written once against this interface and never mention a device. The
// CPU backend (lib/backend/cpu) is the reference implementation; the CUDA backend (cuda/) is
// tested op by op against it.
//
// Conventions shared by all ops:
// - Tensors are contiguous row-major views of memory on this backend's device, except where an
//   op takes an explicit row stride.
// - Activations use activation_dtype(); weights stay in their file dtype (f32, f16, bf16);
//   every reduction and every GEMM accumulates in f32.
// - Ops are enqueued in order on the backend's one stream and may return before they finish;
//   only download(), sample() and synchronize() wait. Nothing inside a forward waits.
// - Bad shapes or dtypes throw Error(invalid_argument) naming the op and the shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/batch.hpp"
#include "tensor/buffer.hpp"

namespace xserv {

// Layout of a GEMM weight as stored in the checkpoint; no transposed copy is made at load.
enum class WeightLayout : std::uint8_t {
  in_out,  // [K, N]: GPT-2 Conv1D
  out_in,  // [N, K]: torch.nn.Linear (Qwen3)
  // [N / 32][K][32]: 32-column panels, each K runs of 32 contiguous weights (the tensor's shape
  // is [K, N] as in_out, N a multiple of 32). The CPU backend's own form of GPT-2's f32 Conv1D
  // weights, packed once at load (Model::conv1d_layout; XSERV_CPU_CONV1D=out_in|in_out not): a prefill GEMM
  // multiplies the panels in place instead of packing a tile per task, and a decode GEMV streams
  // each thread's columns as one contiguous run. Other backends never see it.
  panel32,
};
inline constexpr std::int64_t weight_panel_width = 32;

// One layer's slice of the paged KV cache: k and v are [num_blocks, block_size, n_kv_heads,
// head_dim] in activation_dtype(). Slot s is block s / block_size, offset s % block_size.
struct KvLayer {
  Tensor k;
  Tensor v;
  std::int32_t block_size() const noexcept { return static_cast<std::int32_t>(k.shape[1]); }
};

// Head geometry of the packed QKV activation [T, (n_q_heads + 2 * n_kv_heads) * head_dim]:
// the q heads, then the k heads, then the v heads of each row.
struct HeadGeometry {
  std::int32_t n_q_heads = 0;
  std::int32_t n_kv_heads = 0;  // divides n_q_heads (grouped-query attention)
  std::int32_t head_dim = 0;
  std::int64_t qkv_width() const noexcept {
    return static_cast<std::int64_t>(n_q_heads + 2 * n_kv_heads) * head_dim;
  }
};

// Per-head RMSNorm of q and k (Qwen3) and rotary embedding (neox style: the two halves of each
// head rotate together) over the whole head_dim. Either part may be off (GPT-2: both off).
struct QkTransform {
  Tensor q_norm;  // [head_dim] or empty
  Tensor k_norm;  // [head_dim] or empty
  float norm_eps = 1e-6f;
  bool rope = false;
  float rope_theta = 10000.0f;
};

// Sampling parameters of one logits row. temperature <= 0 means greedy (argmax).
struct SamplingRow {
  float temperature = 1.0f;
  std::int32_t top_k = 0;      // 0: off
  float top_p = 1.0f;          // 1: off
  float min_p = 0.0f;          // 0: off
  float repetition_penalty = 1.0f;  // HF semantics over prompt + generated tokens; 1: off
  float presence_penalty = 0.0f;    // OpenAI semantics over generated tokens; 0: off
  float frequency_penalty = 0.0f;   // OpenAI semantics over generated tokens; 0: off
  std::uint64_t seed = 0;
  std::uint64_t step = 0;  // the row's draw counter: (seed, step) fixes its random number
};

// Sampling inputs for all rows of a logits tensor; the token histories feed the penalties.
struct SamplingBatch {
  std::vector<SamplingRow> rows;
  // Row r's prompt tokens are prompt_tokens[prompt_start[r] .. prompt_start[r+1]), likewise its
  // generated tokens. Both offset vectors have rows.size() + 1 entries (or are empty when no
  // row uses a penalty).
  std::vector<std::int32_t> prompt_tokens, prompt_start;
  std::vector<std::int32_t> output_tokens, output_start;
};

// The uniform random number in [0, 1) that row (seed, step) draws; both backends use it, so a
// seed gives the same stream on CPU and GPU.
float sampling_uniform(std::uint64_t seed, std::uint64_t step) noexcept;

// Device memory of a backend (CPU: the host's RAM).
struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// The most top log-probabilities Backend::logprobs returns per row (OpenAI's limit).
inline constexpr std::int32_t max_top_logprobs = 20;

struct BackendOptions {
  std::size_t threads = 0;  // CPU: worker threads, 0 = all hardware threads
  int device_index = 0;     // CUDA: which GPU
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const noexcept = 0;
  virtual std::string name() const = 0;
  // Activation dtype for a model whose weights are `weights` (CPU: always f32).
  virtual DType activation_dtype(DType weights) const noexcept = 0;
  // The K/V cache's dtype for such a model: the activation dtype, unless the backend keeps the
  // cache narrower (CPU with XSERV_CPU_KV=bf16: bf16 for 16-bit weights, half the bytes each
  // decode step's attention reads).
  virtual DType kv_dtype(DType weights) const noexcept { return activation_dtype(weights); }
  // Whether this backend's attention reads a K/V cache of dtype `kv` for such a model (a host's
  // explicit choice, ModelOptions::kv_dtype): by default only the activation dtype.
  virtual bool supports_kv_dtype(DType weights, DType kv) const noexcept {
    return kv == activation_dtype(weights);
  }

  // ---- memory --------------------------------------------------------------------------
  virtual Allocator& allocator() noexcept = 0;
  // A weight read from a host view (usually the mmap'd checkpoint) made resident on this
  // backend. CPU returns the view itself (zero copy); CUDA copies it into its weight arena.
  virtual Tensor import_weight(const Tensor& host) = 0;
  // Says that the next import_weight calls, of these byte sizes in this order, should land back
  // to back in device memory (a layer's q|k|v or gate|up, which a model then runs as one stacked
  // weight). A hint: the default (CPU: weights are views of the mapping) ignores it.
  virtual void reserve_adjacent_weights(std::span<const std::size_t> bytes) { (void)bytes; }
  virtual void upload(Tensor dst, const void* host_src) = 0;      // dst.bytes() bytes
  virtual void download(void* host_dst, const Tensor& src) = 0;  // waits for pending work
  virtual void fill_zero(Tensor dst) = 0;
  // dst = src (same bytes, both on this device). Enqueued like an op.
  virtual void copy(Tensor dst, const Tensor& src) = 0;
  // dst [N, K] = src [K, N] transposed (2-D, same dtype, both on this device, not overlapping).
  // Enqueued like an op. Models use it at load to turn GPT-2's [in, out] Conv1D weights into the
  // [out, in] layout the decode GEMVs stream best (Model::conv1d_layout).
  virtual void transpose(Tensor dst, const Tensor& src) = 0;
  // Memory free now and in total on this backend's device (CPU: available and physical RAM).
  virtual MemoryInfo memory_info() const = 0;
  // Puts a ForwardBatch where the ops can read it; the returned views stay valid until the next
  // upload_batch call.
  virtual DeviceBatch upload_batch(const ForwardBatch& batch) = 0;
  virtual void synchronize() = 0;
  // Makes the calling thread ready to enqueue work here (CUDA: this backend's device becomes
  // the thread's current one). Tensor-parallel ranks call it on their own threads.
  virtual void bind_thread() {}
  // The stream ops are enqueued on (CUDA: its cudaStream_t), for a collective library that
  // must enqueue on it too (NCCL); nullptr for the CPU.
  virtual void* native_stream() noexcept { return nullptr; }
  // Model::warm_up runs its forwards between set_warming_up(true) and set_warming_up(false):
  // there a backend may pay one-time costs that a request must not, such as choosing launch
  // configurations by timing them (CUDA: cuBLASLt algorithms of the batched-decode row buckets,
  // cuda/gemm.hpp). Default: nothing.
  virtual void set_warming_up(bool on) { (void)on; }

  // ---- ops -----------------------------------------------------------------------------
  // out[T, d] = table[ids[t]] (+ pos_table[positions[t]] when pos_table is not empty).
  virtual void embedding(Tensor out, const Tensor& ids, const Tensor& table,
                         const Tensor& pos_table, const Tensor& positions) = 0;

  // out = LayerNorm(x) * weight + bias over the last dim. With a non-empty residual the input is
  // residual += x first, and out = LayerNorm(residual) (the fused add of pre-norm blocks).
  virtual void layer_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                          const Tensor& bias, float eps) = 0;
  // Same contract with RMSNorm (no bias).
  virtual void rms_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                        float eps) = 0;

  // out[M, N] = a[M, K] · W + bias + beta * out, with W [K, N] (in_out) or [N, K] (out_in) and
  // bias [N] or empty. beta = 1 fuses a residual add. out rows are out_row_stride elements
  // apart (0: N), so several GEMMs can fill column slices of one packed activation.
  virtual void gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                    const Tensor& bias, float beta = 0.0f, std::int64_t out_row_stride = 0) = 0;

  // Several out_in GEMMs of one activation side by side, as gemm() once per part:
  //   out[:, c_i : c_i + N_i] = a · W_i^T + bias_i     (W_i [N_i, K]; c_0 = 0, c_i+1 = c_i + N_i)
  // out's width is the sum of the N_i; biases is empty or has one tensor (empty or [N_i]) per
  // part. A backend may run them as one op: the CPU backend streams all the parts' weights in one
  // pass of its threads at decode (q/k/v, gate/up kept apart in the checkpoint), one hand-off and
  // one tail instead of one per part.
  virtual void gemm_parts(Tensor out, const Tensor& a, std::span<const Tensor> ws,
                          std::span<const Tensor> biases);

  // The input side of a pre-norm block as one op, which a backend may run as one kernel:
  //   h = RMSNorm(x) * norm_weight        (as rms_norm without a residual)
  //   y = h · W                            (W out_in [N, K])
  //   out = swiglu ? silu(y[:, :N/2]) * y[:, N/2:] : y     (as swiglu: W stacks gate, then up)
  // h_scratch [T, K] and, with swiglu, y_scratch [T, N] hold the intermediates when the steps
  // run separately (the default implementation); their contents afterwards are unspecified.
  // Without swiglu, out may be f32 with x in another dtype, as gemm allows (logits: a decoder's
  // final norm and lm_head).
  virtual void rms_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight, float eps,
                             const Tensor& w, bool swiglu, Tensor h_scratch, Tensor y_scratch);

  // A residual GEMM and the next pre-norm block's input side as one op (a block's o_proj and
  // its MLP's input side, or its down_proj and the next layer's q|k|v):
  //   x += a · W_res^T                     (as gemm with beta = 1, W_res out_in [N_x, K])
  //   rms_norm_gemm(out, x, norm_weight, eps, w, swiglu, h_scratch, y_scratch)
  // A backend may sum a GEMM split in K together with the residual and the norm in one kernel
  // (CUDA at batched-decode rows). h_scratch [T, N_x] and y_scratch are as in rms_norm_gemm.
  virtual void gemm_rms_norm_gemm(Tensor x, const Tensor& a, const Tensor& w_res, const Tensor& norm_weight,
                                  float eps, const Tensor& w, bool swiglu, Tensor out, Tensor h_scratch,
                                  Tensor y_scratch);

  // A pre-norm block's whole SwiGLU MLP with its residual, as one op:
  //   x += swiglu(RMSNorm(x) * norm_weight · W_gate_up^T) · W_down^T
  // (rms_norm_gemm with swiglu into act_scratch [T, I], then gemm with beta = 1; W_gate_up
  // [2I, N_x] stacks gate then up, W_down [N_x, I]). h_scratch [T, N_x] and y_scratch [T, 2I] are
  // rms_norm_gemm's. A backend runs it as one kernel only where fuses_rms_norm_mlp says so (CUDA:
  // one decode row, XSERV_CUDA_FUSED_MLP); elsewhere a model keeps its residual GEMMs paired with
  // the next norm (gemm_rms_norm_gemm), which this op's default implementation does not.
  virtual bool fuses_rms_norm_mlp(const Tensor& x, const Tensor& gate_up_w, const Tensor& down_w) const noexcept {
    (void)x, (void)gate_up_w, (void)down_w;
    return false;
  }
  virtual void rms_norm_mlp(Tensor x, const Tensor& norm_weight, float eps, const Tensor& gate_up_w,
                            const Tensor& down_w, Tensor act_scratch, Tensor h_scratch, Tensor y_scratch);

  // The same for LayerNorm blocks (GPT-2), with the GEMM's bias and an optional GELU:
  //   h = LayerNorm(x) * norm_weight + norm_bias   (as layer_norm without a residual)
  //   out = h · W + bias                            (W in `layout`, bias [N] or empty)
  //   out = gelu ? gelu_tanh(out) : out             (as gelu)
  // h_scratch [T, K] holds h when the steps run separately; its contents afterwards are
  // unspecified.
  virtual void layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                               const Tensor& norm_bias, float eps, const Tensor& w,
                               WeightLayout layout, const Tensor& bias, bool gelu,
                               Tensor h_scratch);

  // In place on the q and k parts of qkv [T, qkv_width]: per-head RMSNorm then RoPE at each
  // row's position, as QkTransform says; then k and v of every row go to the cache at
  // slot_mapping[row].
  virtual void qk_transform_store(Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                                  const DeviceBatch& batch, KvLayer cache) = 0;

  // Causal attention of each row's q (from qkv) over its sequence's cached K/V (positions
  // 0 ..= its own), grouped-query: q head h reads kv head h / (n_q_heads / n_kv_heads).
  // out is [T, n_q_heads * head_dim]; scale multiplies q·k.
  virtual void attention(Tensor out, const Tensor& qkv, const HeadGeometry& heads,
                         const DeviceBatch& batch, const KvLayer& cache, float scale) = 0;

  // qk_transform_store, then attention: one layer's attention as one op, which a backend may run
  // as one kernel (CUDA: for decode steps over short contexts). The q part of qkv is unspecified
  // afterwards; k and v are in the cache as qk_transform_store leaves them.
  virtual void qk_attention(Tensor out, Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                            const DeviceBatch& batch, KvLayer cache, float scale);

  // A hint with no effect on any result: the op after the next one reads all of w (a weight),
  // so the next op may start bringing it closer while it runs. Give it right before that next
  // op: it holds for that op only. The default ignores it; CUDA takes it in qk_attention (the
  // short-context decode kernel asks the o_proj's weight into L2 after its wait, where that GEMM
  // is the skinny kernel: XSERV_CUDA_ATTN_L2_NEXT_MB) and in gemm_rms_norm_gemm (the skinny
  // SwiGLU GEMM, opt-in: XSERV_CUDA_SKINNY_L2_NEXT_MB); docs/cuda.md.
  virtual void prefetch_next(const Tensor& w) { (void)w; }

  // x = gelu_tanh(x) in place (GPT-2's gelu_new).
  virtual void gelu(Tensor x) = 0;
  // out[T, I] = silu(gate_up[:, :I]) * gate_up[:, I:] for gate_up [T, 2I].
  virtual void swiglu(Tensor out, const Tensor& gate_up) = 0;
  // out[R, d] = x[rows[r]] for the batch's logit rows.
  virtual void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) = 0;

  // One token per logits row (logits [R, V] f32; modified in place by penalties/temperature).
  // Writes R ids to out_ids (host memory) and waits for them: the only host wait of a step.
  virtual void sample(Tensor logits, const SamplingBatch& params, std::int32_t* out_ids) = 0;

  // ---- overlapped steps (the engine's async steps, docs/engine.md) ----------------------
  // sample() without the wait: enqueues the same sampling (same draws, same ids), writes the R
  // ids into `ids_out` (i32 [R] on this device, where a later resolve_tokens can read them)
  // and starts their copy to the host. Returns a ticket for wait_sampled, which every ticket
  // must reach (it also frees the ticket's staging memory). Several tickets may be open at once
  // (a step is enqueued before the previous one's ids are read).
  virtual std::uint64_t sample_async(Tensor logits, const SamplingBatch& params, Tensor ids_out);
  // Waits for a ticket's ids and writes them (R of them, host memory) to out_ids.
  virtual void wait_sampled(std::uint64_t ticket, std::int32_t* out_ids);
  // Replaces every negative token id t of `tokens` (i32 [T] on this device, e.g. an uploaded
  // batch's token_ids) by sampled[-t - 1], in stream order: the input tokens of a step whose
  // previous step's ids have not reached the host yet. The caller keeps -t - 1 < sampled rows.
  virtual void resolve_tokens(Tensor tokens, const Tensor& sampled);
  // Whether the three above run without waiting (false: the defaults, which throw).
  virtual bool samples_async() const noexcept { return false; }

  // ---- decode batches kept on the device (overlapped steps' steady state) ---------------
  // upload_batch for a decode step (one token per sequence) whose ops begin with
  // prepare_decode. The first `growing` sequences grow by one token a step; the others (the
  // padding of a recorded batch size) stay as they are. When `batch` is exactly the last one
  // that went through here advanced by one token (each growing row's position, slot and
  // context one further; tokens, block tables and everything else equal), the backend may skip
  // the copy: prepare_decode then advances the batch where it is. Any other batch is copied.
  virtual DeviceBatch upload_decode_batch(const ForwardBatch& batch, std::int32_t growing) {
    (void)growing;
    return upload_batch(batch);
  }
  // The first op of a decode step uploaded by upload_decode_batch (recorded with the step):
  // advances the batch on the device when its copy was skipped, and puts sampled ids in place of
  // placeholder tokens as resolve_tokens does.
  virtual void prepare_decode(const DeviceBatch& batch, const Tensor& sampled) {
    resolve_tokens(batch.token_ids, sampled);
  }
  // Whether the two above keep batches on the device (CUDA, unless XSERV_CUDA_DEVICE_BATCH=0);
  // false: callers use upload_batch and resolve_tokens.
  virtual bool keeps_decode_batches() const noexcept { return false; }

  // Log-probabilities under log_softmax of raw logits [R, V] f32 (read only; sample() changes
  // logits in place, so pass them before sampling or a copy): per row r, the log-probability of
  // ids[r] (host, R ids) into out_logprobs[r], and the row's top_n (0 ..= max_top_logprobs) most
  // likely tokens, most likely first (ties: lower id first), into out_top_ids and
  // out_top_logprobs [R * top_n]. Outputs are host memory; waits for them.
  virtual void logprobs(const Tensor& logits, const std::int32_t* ids, std::int32_t top_n,
                        float* out_logprobs, std::int32_t* out_top_ids,
                        float* out_top_logprobs) = 0;

  // ---- graphs --------------------------------------------------------------------------
  // Runs `ops`: op calls whose launch shapes depend only on `key` (e.g. a decode step at one
  // padded batch size) and on the last upload_batch's shape. A backend may record them once and
  // replay the recording on later calls with the same key and shape (CUDA graphs) without
  // calling `ops` again, so `ops` must only enqueue ops (no host-side effects, no waits) and
  // read every input through memory whose address is the same on each call (upload_batch's
  // views, buffers allocated once). Default: just runs them.
  virtual void run_graph(std::uint64_t key, const std::function<void()>& ops) {
    (void)key;
    ops();
  }
  // Whether run_graph records and replays (true for CUDA): callers then gain from keeping the
  // number of distinct keys small, e.g. by padding decode batches to a few sizes.
  virtual bool records_graphs() const noexcept { return false; }
  // How many recordings run_graph holds now (0 when it records none): lets tests check that
  // replays stay in use as batches change instead of one recording per step.
  virtual std::size_t recorded_graphs() const noexcept { return 0; }
};

// gemm_parts' argument checks (shared by the implementations): one bias or none per weight,
// 2-D tensors, the weights' rows adding up to out's width.
void check_gemm_parts(const Tensor& out, std::span<const Tensor> ws, std::span<const Tensor> biases);
// Columns [col, col + n) of a packed [T, width] activation, for a GEMM with out_row_stride.
Tensor column_slice(const Tensor& packed, std::int64_t col, std::int64_t n);

// Creates the backend for a device kind. Throws Error(unsupported) for CUDA when xserv was
// built without it, Error(cuda) when no GPU can be used.
std::unique_ptr<Backend> make_backend(DeviceKind kind, const BackendOptions& options = {});
// True when xserv was built with CUDA and a GPU is visible.
bool cuda_available() noexcept;

}  // namespace xserv
