// Model: a causal language model (GPT-2 or Qwen3 family) written once against the Backend ops.
//
// load() reads config.json, picks the architecture from the registry (model_type, then
// architectures), makes every weight resident through backend.import_weight() (zero copy on the
// CPU: the views point into the mmap'd checkpoint) and sizes the activation workspace once for
// max_batch_tokens. forward() then runs a packed batch (prefill, decode or a mix) without
// allocating and without waiting for the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "io/model_config.hpp"
#include "io/safetensors.hpp"
#include "kv/kv_cache.hpp"
#include "models/shard.hpp"
#include "parallel/communicator.hpp"

namespace xserv {

struct ModelOptions {
  // Fill every weight in place with seeded random values instead of reading a checkpoint (only
  // config.json is read): benchmarks of real shapes without the files.
  bool dummy_weights = false;
  std::uint64_t dummy_seed = 0;
  // Largest number of tokens one forward may hold; the workspace is sized for it once.
  std::int32_t max_batch_tokens = 512;
  // Largest number of logits rows one forward may return (0: max_batch_tokens, capped at 256).
  std::int32_t max_logit_rows = 0;
  // Called after each weight is resident: (bytes done, bytes total).
  std::function<void(std::size_t, std::size_t)> on_progress;
  // On a device backend (CUDA), run a prompt of each length 1..8, 16, each multiple of 32 up to
  // 256 and each power-of-two length up to max_batch_tokens, and a sampling, at the end of the
  // load, so the one-time costs of first use (GEMM algorithm choice per row bucket, optionally
  // timed for batched decode's: Backend::set_warming_up; first kernel launches) are paid here
  // and not by a request's first token. Ignored on the CPU, which has none.
  bool warm_up = true;
  // Tensor parallelism: this model is rank communicator->rank() of communicator->size() and
  // loads only its Shard; its forward sums the row-parallel GEMMs' partial results over the
  // ranks with it. Every rank must load and run forward() at the same time, each on its own
  // thread (ModelGroup does that). nullptr: the whole model on one backend.
  Communicator* communicator = nullptr;
  // The K/V cache's dtype; nullopt: the backend's choice (Backend::kv_dtype). Another must be
  // one the backend's attention reads (Backend::supports_kv_dtype), else load throws
  // ErrorCode::unsupported.
  std::optional<DType> kv_dtype;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Throws Error(not_found | io | format) for missing or malformed files (a missing or
  // mis-shaped tensor is Error(format) naming it and both shapes; so is a config whose layer
  // count differs from the checkpoint's, checked before anything is sized from the config),
  // Error(unsupported) for an unknown architecture.
  static std::unique_ptr<Model> load(const std::string& dir, Backend& backend,
                                     const ModelOptions& options = {});

  const ModelConfig& config() const noexcept { return config_; }
  const std::string& dir() const noexcept { return dir_; }
  Backend& backend() const noexcept { return backend_; }
  DType weight_dtype() const noexcept { return weight_dtype_; }
  DType activation_dtype() const noexcept { return backend_.activation_dtype(weight_dtype_); }
  std::int32_t max_batch_tokens() const noexcept { return max_batch_tokens_; }
  std::int32_t max_logit_rows() const noexcept { return max_logit_rows_; }
  std::size_t weight_bytes() const noexcept { return weight_bytes_; }
  // The part of the model this rank holds (rank 0 of 1 without tensor parallelism).
  const Shard& shard() const noexcept { return shard_; }
  // Held by whoever runs forward() and reads its logits: engines sharing a model share its
  // workspace, so their steps take turns.
  std::mutex& forward_mutex() const noexcept { return forward_mutex_; }

  // Throws Error(format) when a tokenizer of `tokenizer_vocab` ids (its largest id + 1) has ids
  // past the embedding's rows: those would reach the embedding gather out of bounds. Fewer ids
  // than rows is fine (padding rows, Qwen3: 151669 ids, 151936 rows). Call it once the model's
  // tokenizer is loaded; `tokenizer_source` names it in the message.
  void check_tokenizer(std::int32_t tokenizer_vocab, const std::string& tokenizer_source) const;

  // What a KV cache for this model (this rank's shard: its KV heads) holds per layer.
  kv::KvSpec kv_spec() const noexcept;

  // f32 logits [R, vocab] of the batch's logit rows, in workspace memory that the next forward
  // overwrites; [0, vocab] on tensor-parallel ranks other than 0. Throws Error(invalid_argument) when the batch is larger than the workspace or the
  // cache does not fit the model. Enqueues work only: read the logits with backend.sample() or
  // backend.download().
  Tensor forward(const DeviceBatch& batch, kv::KvCache& cache);
  // Validates and uploads a host batch, then forward(). Convenience for tests and tools.
  Tensor forward(const ForwardBatch& batch, kv::KvCache& cache);

  // See ModelOptions::warm_up; load() calls it. Uses a KV cache of its own, freed on return.
  void warm_up();

 protected:
  Model(ModelConfig config, std::string dir, Backend& backend)
      : config_(std::move(config)), dir_(std::move(dir)), backend_(backend) {}

  // The architecture's layers; batch and cache were checked by forward().
  virtual Tensor run(const DeviceBatch& batch, kv::KvCache& cache) = 0;

  // Declares a workspace tensor; allocate_workspace() then carves all of them from one Buffer
  // (64-byte aligned each) and points `dst` at its piece. `dst` must be a member.
  void plan_workspace(Tensor* dst, DType dtype, Shape shape);
  void allocate_workspace();
  // Checks the sizes, sets max_batch_tokens_ / max_logit_rows_ from the options, and the
  // tensor-parallel shard_ and communicator from options.communicator.
  void set_limits(const ModelOptions& options);
  // The layout a checkpoint's in_out ([K, N], GPT-2 Conv1D) weights are used in. CPU: the
  // backend's 32-column panels (WeightLayout::panel32, packed once at load by pack_panels) for
  // f32 weights whose widths are multiples of 32, else out_in: the prefill GEMM multiplies the
  // panels in place and each decode GEMV thread streams one contiguous run (GPT-2 124M f32 on
  // the GPU machine's Xeon at 8 threads: prefill +13%, decode +6% over out_in).
  // XSERV_CPU_CONV1D=out_in: transposed once at load (transpose_in_out), the rule before.
  // CUDA: out_in, the decode GEMV being the out_in kernel with the LayerNorm fused in front of
  // it instead of a K-split in_out kernel. As stored with XSERV_CPU_CONV1D=in_out /
  // XSERV_CUDA_CONV1D=in_out.
  WeightLayout conv1d_layout() const noexcept;
  // w [K, N] -> [N, K]: on the CPU a copy in host memory the model keeps (the weight is a view
  // of the mapping); on a device in place (through a scratch buffer).
  Tensor transpose_in_out(const Tensor& w);
  // w [K, N] (in_out, N a multiple of 32, a CPU weight) -> the same weights as 32-column panels
  // (WeightLayout::panel32), a host copy the model keeps.
  Tensor pack_panels(const Tensor& w);

  // Row-parallel GEMMs write into the residual stream x with this beta: rank 0 adds its partial
  // result to x (beta 1), the others overwrite their x with theirs (beta 0), so that the sum
  // over ranks, all_reduce(x), is x + the full result: the residual (and a row-parallel
  // layer's bias, passed on rank 0 only) counted once.
  float residual_beta() const noexcept { return shard_.leader() ? 1.0f : 0.0f; }
  // x = the sum of x over the ranks (nothing without tensor parallelism).
  void all_reduce(Tensor x) {
    if (communicator_ != nullptr) communicator_->all_reduce_sum(x);
  }

  ModelConfig config_;
  std::string dir_;
  Backend& backend_;
  DType weight_dtype_ = DType::f32;
  std::optional<DType> kv_dtype_;  // ModelOptions::kv_dtype
  std::int32_t max_batch_tokens_ = 0;
  std::int32_t max_logit_rows_ = 0;
  std::size_t weight_bytes_ = 0;
  Shard shard_;

 private:
  struct Planned {
    Tensor* dst;
    DType dtype;
    Shape shape;
  };
  std::vector<Planned> planned_;
  Communicator* communicator_ = nullptr;
  mutable std::mutex forward_mutex_;
  Buffer workspace_;
  // Keep the weights alive: the mmap'd checkpoint (CPU views point into it) or dummy buffers.
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<Buffer> weight_buffers_;
};

}  // namespace xserv
