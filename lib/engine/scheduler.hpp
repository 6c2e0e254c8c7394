// Scheduler: decides what one engine step runs, and returns it as plain data.
//
// Policy, not mechanism: it never calls a model or a backend; blocks come from a kv::BlockPool.
// Each schedule():
//   1. running sequences first, oldest first: one decode token each, or their next prompt chunk
//      (a prompt longer than the budget is prefilled over several steps, mixed with decodes);
//   2. then waiting ones, first come first served, while the token budget and max_seqs allow;
//      at admission the prefix cache supplies the K/V of full blocks already computed (the last
//      token is always recomputed: its logits are needed), and sample i > 0 of a request shares
//      sample 0's full prompt blocks;
//   3. blocks are allocated as sequences grow. When none is free, the newest running sequence
//      is preempted (blocks released, recomputed later) and, in a step that preempted, no
//      waiting sequence is admitted;
//   4. a sequence that can never fit (tokens + 1 need more blocks than the pool holds) is
//      failed alone, with a message; the step goes on.
// After the forward the engine calls update() (the chunks' tokens now have K/V; full blocks
// enter the prefix cache), appends sampled tokens, and remove()s finished sequences.
// Not thread-safe: the engine's step thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/sequence.hpp"
#include "kv/block_pool.hpp"

namespace xserv {

struct SchedulerConfig {
  std::int32_t max_seqs = 256;          // sequences running at once
  std::int32_t max_batch_tokens = 512;  // tokens per step
  // Tokens of multi-token chunks (prompts, recomputation) per step at most; 0: no cap beyond
  // max_batch_tokens. A cap bounds how long a step with decodes in it can take (the decode
  // stall a long prompt causes) at the cost of slower prefill.
  std::int32_t max_prefill_tokens = 0;
};

// One sequence's share of a step: tokens [start, start + num_tokens) of seq->tokens.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  std::int32_t start = 0;
  std::int32_t num_tokens = 0;
  bool sample = false;  // the chunk reaches the last token: its logits give the next one
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;  // running order; the batch is packed in this order
  std::vector<Sequence*> preempted;    // back in the waiting queue, blocks released
  std::vector<Sequence*> failed;       // can never run: seq->error says why; already removed
  std::int32_t num_tokens = 0;
  std::int32_t num_prompt_tokens = 0;  // of which prompt positions (recomputed ones included)
  std::int32_t num_cached_tokens = 0;  // tokens admitted from the prefix cache this step

  bool empty() const noexcept { return chunks.empty(); }
  // Every chunk is one token that samples (a pure decode step: graph-replay friendly).
  bool decode_only() const noexcept;
};

class Scheduler {
 public:
  Scheduler(kv::BlockPool& pool, const SchedulerConfig& config);

  // Queues a sequence (status waiting, no blocks) behind the others.
  void add(Sequence* seq);
  // Takes a sequence out wherever it is, releasing its blocks; status becomes finished.
  void remove(Sequence* seq);

  SchedulerOutput schedule();
  // After the step's forward: advances num_computed over the chunks and commits full blocks.
  void update(const SchedulerOutput& out);

  // Whether the next schedule() is certain to be a plain decode of every running sequence:
  // nothing waits, each running sequence has one token to compute, they all fit the token
  // budget and the pool has the blocks they grow into (no preemption). The engine's overlapped
  // steps schedule on top of a step still in flight only then.
  bool next_is_plain_decode() const noexcept;
  const std::vector<Sequence*>& running() const noexcept { return running_; }

  std::int32_t num_running() const noexcept { return static_cast<std::int32_t>(running_.size()); }
  std::int32_t num_waiting() const noexcept { return static_cast<std::int32_t>(waiting_.size()); }
  std::uint64_t preemptions() const noexcept { return preemptions_; }
  const SchedulerConfig& config() const noexcept { return config_; }
  kv::BlockPool& pool() noexcept { return pool_; }

 private:
  std::int32_t blocks_for(std::int32_t tokens) const noexcept;
  bool can_never_fit(const Sequence& s) const noexcept;
  // Gives `s` blocks for `tokens` tokens, preempting the newest running sequences when the pool
  // is empty. False when `s` itself had to be preempted.
  bool grow_running(Sequence& s, std::int32_t tokens, SchedulerOutput& out);
  // Admission: prefix-cache hits or the leader's blocks, then blocks for `chunk` more tokens.
  // False (and nothing held) when the pool cannot give them now.
  bool admit(Sequence& s, std::int32_t budget, std::int32_t prefill_left, ScheduledChunk& chunk);
  // Tokens `s` may run this step: its pending tokens under the budgets (0: none).
  static std::int32_t chunk_size(const Sequence& s, std::int32_t budget, std::int32_t prefill_left);
  void take_cached_prefix(Sequence& s);
  void preempt(Sequence& s, SchedulerOutput& out);
  void release_blocks(Sequence& s) noexcept;
  void fail(Sequence& s, SchedulerOutput& out);  // s already out of the queues

  kv::BlockPool& pool_;
  SchedulerConfig config_;
  std::vector<Sequence*> running_;  // ascending arrival
  std::deque<Sequence*> waiting_;   // FCFS; preempted ones go back to the front
  std::uint64_t preemptions_ = 0;
};

}  // namespace xserv
