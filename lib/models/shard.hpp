// Shard: which part of a model one tensor-parallel rank holds (Megatron-style, docs/parallel.md).
//
// Attention heads and the MLP's inner dimension are split in equal contiguous blocks: rank r
// holds q heads [q_head_begin, + q_heads), their kv heads, and inner columns [inner_begin,
// + inner). KV heads split like q heads when size divides their number; when there are fewer
// KV heads than ranks (size a multiple of num_kv_heads), each rank holds the one KV head its q
// heads read, so ranks of one group hold copies of it (as vLLM does). Embeddings and norms are
// whole on every rank; the final norm and lm_head live on rank 0 only, which alone computes
// logits (see docs/parallel.md for why not vocab-parallel).
#pragma once

#include <cstdint>
#include <string>

#include "io/model_config.hpp"

namespace xserv {

struct Shard {
  int rank = 0;
  int size = 1;
  std::int32_t q_heads = 0, q_head_begin = 0;
  std::int32_t kv_heads = 0, kv_head_begin = 0;
  std::int64_t inner = 0, inner_begin = 0;

  // Rank 0 holds the head and returns logits; the others return none.
  bool leader() const noexcept { return rank == 0; }

  // Throws Error(invalid_argument) naming `source` when size < 1, rank is outside 0 ..
  // size-1, or size does not divide the q heads, the KV heads (nor is a multiple of them) or
  // the MLP's inner size.
  static Shard plan(const ModelConfig& config, int rank, int size, const std::string& source);
};

}  // namespace xserv
