#include "models/shard.hpp"

#include "core/error.hpp"

namespace xserv {

Shard Shard::plan(const ModelConfig& c, int rank, int size, const std::string& source) {
  XSERV_CHECK(size >= 1, ErrorCode::invalid_argument,
              "tensor-parallel size {} (expected at least 1)", size);
  XSERV_CHECK(rank >= 0 && rank < size, ErrorCode::invalid_argument,
              "tensor-parallel rank {} outside 0 ..= {}", rank, size - 1);
  XSERV_CHECK(c.num_heads % size == 0, ErrorCode::invalid_argument,
              "{}: tensor-parallel size {} does not divide the model's {} attention heads", source,
              size, c.num_heads);
  XSERV_CHECK(c.num_kv_heads % size == 0 || size % c.num_kv_heads == 0,
              ErrorCode::invalid_argument,
              "{}: tensor-parallel size {} neither divides nor is a multiple of the model's {} KV "
              "heads",
              source, size, c.num_kv_heads);
  XSERV_CHECK(c.intermediate_size % size == 0, ErrorCode::invalid_argument,
              "{}: tensor-parallel size {} does not divide the MLP's inner size {}", source, size,
              c.intermediate_size);
  Shard s;
  s.rank = rank;
  s.size = size;
  s.q_heads = c.num_heads / size;
  s.q_head_begin = rank * s.q_heads;
  if (c.num_kv_heads % size == 0) {
    s.kv_heads = c.num_kv_heads / size;
    s.kv_head_begin = rank * s.kv_heads;
  } else {  // fewer KV heads than ranks: the one KV head this rank's q heads read
    s.kv_heads = 1;
    s.kv_head_begin = rank / (size / c.num_kv_heads);
  }
  s.inner = c.intermediate_size / size;
  s.inner_begin = rank * s.inner;
  return s;
}

}  // namespace xserv
