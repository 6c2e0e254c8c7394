// Engine: continuous batching over one model, driven by the host.
//
// One step, as data (docs/engine.md):
//   inbox (new requests, cancellations) -> Scheduler::schedule() -> SchedulerOutput
//   -> ModelRunner::execute() (one batched forward, sampling on the backend)
//   -> Scheduler::update() -> OutputProcessor per sampled sequence -> events.
// The KV pool (kv::KvCache: the K/V storage and its kv::BlockPool) is sized once, here.
//
// Thread-safety:
// - submit(), cancel(), poll(), has_work() and stats() may be called from any thread at any
//   time, callbacks included: they touch only the inbox, the event queue and counters, each
//   under its own mutex (never held while a callback runs or a forward computes).
// - step() from one thread at a time (the engine thread itself in background mode). Scheduler,
//   block pool, runner and sequences belong to that thread alone.
// - The destructor must not run concurrently with anything else on the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/model_runner.hpp"
#include "engine/output_processor.hpp"
#include "engine/request.hpp"
#include "engine/scheduler.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "models/model_group.hpp"

namespace xserv {

class Tokenizer;

struct EngineOptions {
  std::int32_t max_seqs = 256;          // sequences in the batch at most (capped at the model's
                                        // logits rows)
  std::int32_t max_batch_tokens = 0;    // tokens per step; 0 (or more than the model's): the model's
  std::int32_t max_prefill_tokens = 0;  // prompt-chunk tokens per step (SchedulerConfig); 0: no cap
  // KV pool, taken once: kv_cache_tokens > 0 sets it in tokens; else CUDA takes
  // gpu_memory_fraction of the free device memory, and the CPU kv_cache_bytes (0: max_seqs full
  // contexts, at most a quarter of the RAM).
  std::int64_t kv_cache_tokens = 0;
  float gpu_memory_fraction = 0.9f;
  std::uint64_t kv_cache_bytes = 0;
  std::int32_t block_size = 16;
  bool prefix_cache = true;
  std::int32_t max_waiting = 0;  // submit() fails with resource_exhausted past it; 0: no limit
  bool background_thread = false;
  // Pad decode steps to a few batch sizes for graph replay; unset: when the backend records.
  std::optional<bool> pad_decode_batches;
  // Overlapped ("async") steps, as vLLM's async scheduling: in the steady decode state the next
  // step is scheduled and enqueued before this step's ids reach the host, its input tokens
  // read from the device, so the GPU does not idle while the host processes outputs and builds
  // the next batch (docs/engine.md). Same ids either way. Unset: XSERV_ASYNC_STEPS (0 off, 1
  // on) when set, else on for the CUDA backend. Tests force it on for the CPU backend. Never
  // with tensor parallelism (the other ranks could not read the ids).
  std::optional<bool> async_steps;
};

struct EngineStats {
  std::int32_t running = 0;  // sequences (samples) in the batch
  std::int32_t waiting = 0;  // queued, not admitted (preempted ones and the inbox included)
  std::int32_t kv_blocks_total = 0;  // usable blocks (the null block not counted)
  std::int32_t kv_blocks_used = 0;
  std::int32_t block_size = 0;
  std::uint64_t prefix_queries = 0;
  std::uint64_t prefix_hits = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t steps = 0;
  std::uint64_t prompt_tokens = 0;     // prompt positions computed (cache hits not counted)
  std::uint64_t generated_tokens = 0;
  // Wall time of the steps, split: host work (schedule, batch building, outputs and event
  // delivery) and the forward (upload, model, sampling, the wait for the ids).
  double host_seconds = 0;
  double forward_seconds = 0;
  // The pure decode steps among them (no prompt tokens) and their forward time: a serving
  // run's wall time is these plus the steps that carry prefill chunks.
  std::uint64_t decode_steps = 0;
  double decode_forward_seconds = 0;
  // Steps scheduled and enqueued while the previous step was still in flight (async_steps).
  std::uint64_t overlapped_steps = 0;
  double prefix_hit_rate() const noexcept {
    return prefix_queries ? static_cast<double>(prefix_hits) / static_cast<double>(prefix_queries) : 0.0;
  }
};

class Engine {
 public:
  // The model (and the tokenizer, which may be null: ids only, no stop strings, no text) must
  // outlive the engine. Throws Error(invalid_argument) for bad options, Error(out_of_memory)
  // when the KV pool does not fit.
  Engine(Model& model, const Tokenizer* tokenizer, const EngineOptions& options = {});
  // Over a tensor-parallel model (docs/parallel.md): one scheduler, one KV cache per rank with
  // the same blocks (sized by the rank with the least free memory), every step run on all
  // ranks and sampled on rank 0. `group` must outlive the engine.
  Engine(ModelGroup& group, const Tokenizer* tokenizer, const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request and returns its id (never 0). Throws Error(invalid_argument) for an empty
  // prompt, an id outside the vocabulary, a prompt longer than the context, bad params, n or
  // logprobs out of range, stop strings without a tokenizer; Error(resource_exhausted) when
  // max_waiting requests already wait. Any thread.
  RequestId submit(EngineRequest request);
  // Ends a request at the next step (its samples end with finish cancelled). Unknown or finished
  // ids are ignored. Any thread.
  void cancel(RequestId id);

  // One schedule, one forward, the outputs; returns the number of events it produced. Does
  // nothing when there is no work. When the forward throws, every running sequence ends with an
  // error event and the exception propagates. One thread at a time; not in background mode.
  std::size_t step();
  bool has_work() const noexcept;
  // The oldest queued event of requests without a callback; false when none. Any thread.
  bool poll(EngineEvent& out);
  EngineStats stats() const;

  const std::vector<std::int32_t>& eos_token_ids() const noexcept { return eos_ids_; }
  Model& model() noexcept { return model_; }
  std::int32_t kv_cache_tokens() const noexcept;

 private:
  Engine(Model& model, ModelGroup* group, const Tokenizer* tokenizer, const EngineOptions& options);
  struct Request;
  std::size_t step_locked();
  struct Inbox {
    std::deque<std::unique_ptr<Request>> incoming;
    std::vector<RequestId> cancels;
    bool empty() const noexcept { return incoming.empty() && cancels.empty(); }
  };
  Inbox grab_inbox();
  void apply_inbox(Inbox& inbox, std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks);
  // Overlapped steps: whether the next step may be scheduled on top of the one in flight;
  // launch() enqueues a step and appends a placeholder token to each sampling sequence;
  // finish_in_flight() waits for the oldest launched step's ids and processes them. Both
  // return the seconds they spent in the runner (enqueue and wait).
  bool can_overlap() const;
  double launch(SchedulerOutput out, std::vector<EngineEvent>& events,
                std::vector<EventCallback*>& sinks);
  double finish_in_flight(std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks);
  // The sampled ids of `out` (one per sampling chunk) through the output processors.
  void emit_tokens(const SchedulerOutput& out, std::vector<SampledToken>& sampled,
                   std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks);
  // A step failed: every running sequence ends with an error event, launched steps are dropped,
  // the events go out.
  void fail_step(ErrorCode code, const std::string& message, std::vector<EngineEvent>& events,
                 std::vector<EventCallback*>& sinks);
  // Runs a runner call; when it throws, fail_step() and rethrow.
  template <typename F>
  decltype(auto) guarded(F&& f, std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks);
  void admit_request(std::unique_ptr<Request> r, std::vector<EngineEvent>& events,
                     std::vector<EventCallback*>& sinks);
  void end_sample(Request& r, Sequence& s, EngineEvent event, std::vector<EngineEvent>& events,
                  std::vector<EventCallback*>& sinks);
  void fail_running(ErrorCode code, const std::string& message, std::vector<EngineEvent>& events,
                    std::vector<EventCallback*>& sinks);
  std::size_t deliver(std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks);
  void publish_stats();
  void background_loop();

  Model& model_;
  const Tokenizer* tokenizer_;
  EngineOptions options_;
  std::vector<std::int32_t> eos_ids_;
  std::unique_ptr<kv::KvCache> cache_;
  std::vector<std::unique_ptr<kv::KvCache>> rank_caches_;  // tensor parallel: ranks 1 ..
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;

  // Step-thread state.
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::uint64_t arrivals_ = 0;
  std::uint64_t steps_ = 0, prompt_tokens_ = 0, generated_tokens_ = 0;
  double host_seconds_ = 0, forward_seconds_ = 0;
  std::uint64_t decode_steps_ = 0, overlapped_steps_ = 0;
  double decode_forward_seconds_ = 0;
  // Callbacks of requests that ended in this step, kept alive until their events are delivered.
  std::vector<std::unique_ptr<Request>> retired_;
  // Overlapped steps: whether they are on, and the launched steps whose ids are not processed
  // yet, oldest first (one between steps, two inside a step that overlaps). A chunk whose
  // sequence ended meanwhile has seq == nullptr: its token is dropped.
  bool async_ = false;
  std::deque<SchedulerOutput> in_flight_;

  // Inbox: any thread.
  mutable std::mutex inbox_mutex_;
  std::deque<std::unique_ptr<Request>> inbox_;
  std::vector<RequestId> cancels_;
  std::atomic<RequestId> next_id_{1};
  std::atomic<std::int64_t> live_requests_{0};  // submitted and not yet ended

  // Events for poll(): any thread.
  std::mutex events_mutex_;
  std::deque<EngineEvent> queued_events_;

  mutable std::mutex stats_mutex_;
  EngineStats stats_;

  // Background mode.
  std::mutex step_mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // under inbox_mutex_
  std::thread thread_;
};

}  // namespace xserv
