// Sequence: the state of one sample of one request, as the scheduler and the model runner see it.
//
// Plain data. tokens = the prompt, then the generated ids. Invariants the scheduler keeps:
// - num_computed <= tokens.size(): tokens [0, num_computed) have their K/V in `blocks`;
// - blocks.size() * block_size >= num_computed (blocks are taken as the sequence grows);
// - block_hashes[i] is the prefix-cache hash of full block i, for i < block_hashes.size(), and
//   every such block was offered to the pool's prefix cache (BlockPool::commit).
// A preempted sequence keeps its tokens and drops its blocks (num_computed = 0): it is recomputed
// later and, sampling being keyed by (seed, number of generated tokens), it samples the same ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace xserv {

struct SamplingParams;

enum class SeqStatus : std::uint8_t { waiting, running, finished };

struct Sequence {
  std::uint64_t request = 0;  // the owning request's id
  std::int32_t index = 0;     // which sample of the request
  std::uint64_t arrival = 0;  // submission order: FCFS admission, the newest is preempted first
  std::vector<std::int32_t> tokens;
  std::int32_t prompt_len = 0;
  std::int32_t max_len = 0;  // tokens (prompt + generated) it may reach

  // Scheduler state.
  SeqStatus status = SeqStatus::waiting;
  std::int32_t num_computed = 0;
  std::vector<std::int32_t> blocks;
  std::vector<std::uint64_t> block_hashes;
  std::int32_t cached_tokens = 0;  // prompt tokens found in the prefix cache at first admission
  bool admitted_once = false;
  // A sample i > 0 waits for sample 0 (`leader`, same request, outlives it) to finish the prompt,
  // then shares its full prompt blocks instead of computing them again.
  const Sequence* leader = nullptr;
  std::string error;  // why the scheduler failed it

  // Sampling state (read by the model runner).
  const SamplingParams* params = nullptr;
  std::uint64_t seed = 0;
  std::int32_t logprobs = 0;  // top log-probabilities wanted per token (0: none)

  std::int32_t num_tokens() const noexcept { return static_cast<std::int32_t>(tokens.size()); }
  std::int32_t generated() const noexcept { return num_tokens() - prompt_len; }
  std::int32_t pending() const noexcept { return num_tokens() - num_computed; }
};

}  // namespace xserv
