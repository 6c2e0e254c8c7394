// One engine step as data: the packed batch a Model forward runs (see ARCHITECTURE.md).
//
// Sequences are packed back to back: sequence s owns rows [query_start[s], query_start[s+1]) of
// every activation. Its new tokens sit at the end of its context: row query_start[s] + j has
// position context_lens[s] - query_len(s) + j. Prefill, chunked prefill and decode are the same
// record with different numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/buffer.hpp"

namespace xserv {

struct ForwardBatch {
  std::vector<std::int32_t> token_ids;     // [T] new tokens of all sequences, packed
  std::vector<std::int32_t> positions;     // [T] absolute position of each token
  std::vector<std::int32_t> slot_mapping;  // [T] KV slot (block * block_size + offset) to write
  std::vector<std::int32_t> query_start;   // [S + 1] first row of each sequence, then T
  std::vector<std::int32_t> context_lens;  // [S] tokens in the cache after this step's writes
  std::vector<std::int32_t> block_tables;  // [S * max_blocks_per_seq], unused entries = 0
  std::vector<std::int32_t> logit_rows;    // [R] rows whose logits are wanted, ascending
  std::int32_t max_blocks_per_seq = 0;

  std::int32_t num_tokens() const noexcept { return static_cast<std::int32_t>(token_ids.size()); }
  std::int32_t num_seqs() const noexcept { return static_cast<std::int32_t>(context_lens.size()); }
  std::int32_t max_query_len() const noexcept;
  std::int32_t max_context_len() const noexcept;
  // Throws Error(invalid_argument) when sizes disagree, offsets are not monotone, a position or
  // slot is negative, or a context needs more blocks than max_blocks_per_seq.
  void validate(std::int32_t block_size) const;
};

// The same batch resident on a backend (device memory for CUDA; the host vectors for CPU).
// Host-side maxima travel along because kernels' launch shapes depend on them.
struct DeviceBatch {
  Tensor token_ids, positions, slot_mapping, query_start, context_lens, block_tables, logit_rows;
  std::int32_t num_tokens = 0;
  std::int32_t num_seqs = 0;
  std::int32_t num_logit_rows = 0;
  std::int32_t max_query_len = 0;
  std::int32_t max_context_len = 0;
  std::int32_t max_blocks_per_seq = 0;
};

}  // namespace xserv
