// ModelRunner: executes a SchedulerOutput on the model and returns the sampled tokens.
//
// Execution only (the scheduler decided everything). One execute():
//   SchedulerOutput -> ForwardBatch (packed ids, positions, block tables, slot mapping, one
//   logits row per sampling chunk, in chunk order) -> Model::forward -> Backend::sample (and
//   Backend::logprobs when a sequence asked for them). Only the ids and the requested
//   log-probabilities reach the host.
// Pure decode steps on a backend that records graphs (CUDA) are padded to 1, 2, 4 or a multiple
// of 8 sequences and run through Backend::run_graph keyed by (pool epoch, padded size), so one
// recording serves every batch size up to its padded one as sequences come and go. Padding rows
// hold token 0 at position 0 in the pool's null block (BlockPool::null_block), attend to
// themselves alone, and are sampled nowhere.
// Tensor parallel (a ModelGroup): the one batch is uploaded and run on every rank at once, each
// rank on its own thread with its own KV cache (same block ids: one scheduler); rank 0 returns
// the logits and samples, the others only take part in the all-reduces.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "backend/backend.hpp"
#include "engine/request.hpp"
#include "engine/scheduler.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "models/model_group.hpp"

namespace xserv {

// What one sampling chunk produced.
struct SampledToken {
  std::int32_t token = 0;
  float logprob = 0.0f;             // when the sequence asked for logprobs
  std::vector<TopLogprob> top;      // its `logprobs` most likely tokens, most likely first
};

class ModelRunner {
 public:
  // pad_decode_batches unset: on when the backend records graphs.
  ModelRunner(Model& model, kv::KvCache& cache, std::optional<bool> pad_decode_batches = {});
  // Over the ranks of `group`: caches[r] is rank r's KV cache (caches[0] the one the scheduler
  // allocates from; every cache has its block count).
  ModelRunner(ModelGroup& group, std::vector<kv::KvCache*> caches,
              std::optional<bool> pad_decode_batches = {});

  // One entry per sampling chunk of `out`, in chunk order. Throws what the forward throws.
  std::vector<SampledToken> execute(const SchedulerOutput& out);

  // Overlapped steps (the engine's async steps, docs/engine.md). launch() enqueues what
  // execute() does without waiting for the ids; collect() waits for the oldest launched step's
  // ids and returns them as execute() would. A sequence's token may be a placeholder -(r + 1):
  // row r of the last launch's ids, not yet on the host; the backend reads it from the device
  // (Backend::resolve_tokens). Only steps can_launch() accepts; every launch must be collected.
  bool can_launch(const SchedulerOutput& out) const;
  void launch(const SchedulerOutput& out);
  std::vector<SampledToken> collect();
  std::size_t launched() const noexcept { return pending_.size(); }
  // Whether this runner can launch at all: one rank (the other ranks could not read the ids) on
  // a backend that samples asynchronously. enable_launch() turns launches on (the engine's
  // async_steps), before the first step: from then on every decode recording resolves
  // placeholders itself (see forward_rank).
  bool supports_launch() const noexcept;
  void enable_launch();

  // Seconds the last execute() spent building the batch and sampling inputs on the host (the
  // rest of it is the upload, the forward, sampling and the wait for the ids).
  double last_host_seconds() const noexcept { return last_host_seconds_; }

  // The padded size of a decode step of n sequences: 1, 2, 4, then multiples of 8.
  static std::int32_t padded_decode_size(std::int32_t n) noexcept;

 private:
  void build_batch(const SchedulerOutput& out);
  void pad_batch();
  void build_sampling(const SchedulerOutput& out);
  void compute_logprobs(const Tensor& raw, const SchedulerOutput& out,
                        std::vector<SampledToken>& result);
  // Runs the built batch on one rank: upload, forward (through run_graph for decode steps);
  // returns its logits (rank 0's rows; none on the other ranks).
  Tensor forward_rank(Model& model, kv::KvCache& cache, bool decode_only, bool leader);
  // build_batch, build_sampling, padding and the forward; the logits of the sampled rows.
  Tensor prepare_and_forward(const SchedulerOutput& out);

  Model& model_;
  kv::KvCache& cache_;
  ModelGroup* group_ = nullptr;        // tensor parallel: every rank's model
  std::vector<kv::KvCache*> caches_;   // and cache; caches_[0] == &cache_
  bool pad_;
  // Recordings hold the pool's addresses; a later pool may land at the same address, so every
  // runner has a process-unique epoch in its graph keys.
  std::uint64_t epoch_;
  // A replay returns no tensor: the logits view of each recorded size (model workspace).
  std::map<std::int32_t, Tensor> decode_logits_;
  ForwardBatch batch_;
  SamplingBatch sampling_;
  std::vector<std::int32_t> ids_;
  Buffer raw_logits_;  // a copy of the logits before sampling changes them (logprobs only)
  // Overlapped steps: the launched steps' ids on the device (one buffer: a step's resolve reads
  // it before the step's own sampling overwrites it, in stream order) and, oldest first, the
  // tickets and row counts still to collect. batch_placeholders_: build_batch met placeholder
  // tokens, so the upload needs resolving against the last launch's `last_rows_` ids.
  bool launches_ = false;
  Buffer sampled_ids_;  // max_logit_rows ids, allocated by enable_launch()
  struct Pending {
    std::uint64_t ticket = 0;
    std::size_t rows = 0;
  };
  std::vector<Pending> pending_;
  std::size_t last_rows_ = 0;
  bool batch_placeholders_ = false;
  std::int32_t growing_seqs_ = 0;  // the built batch's sequences before padding
  double last_host_seconds_ = 0;
};

}  // namespace xserv
