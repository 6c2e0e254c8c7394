// KvCache: the paged K/V pools of every layer plus the BlockPool of their block ids.
//
// Per layer one Buffer from backend.allocator() holds K then V, each
// [num_blocks, block_size, num_kv_heads, head_dim] in the backend's activation dtype (the layout
// KvLayer documents). All memory is taken once here; forwards only read and write slots.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "kv/block_pool.hpp"

namespace xserv::kv {

// The per-layer geometry of what is cached.
struct KvSpec {
  std::int32_t num_layers = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  DType dtype = DType::f32;

  // Bytes one block takes over all layers, K and V.
  std::size_t bytes_per_block(std::int32_t block_size) const noexcept;
};

struct KvCacheOptions {
  std::int32_t block_size = 16;
  // Pool size, the null block included (at least 2): num_blocks when > 0, else as many blocks
  // as fit in memory_bytes.
  std::int32_t num_blocks = 0;
  std::size_t memory_bytes = 0;
  bool prefix_cache = true;  // see BlockPool
};

class KvCache {
 public:
  // Throws Error(invalid_argument) for a bad spec or a pool of zero blocks, Error(out_of_memory)
  // from the allocator.
  KvCache(Backend& backend, const KvSpec& spec, const KvCacheOptions& options);

  const KvSpec& spec() const noexcept { return spec_; }
  std::int32_t block_size() const noexcept { return block_size_; }
  std::int32_t num_blocks() const noexcept { return blocks_.num_blocks(); }
  std::int32_t capacity_tokens() const noexcept { return num_blocks() * block_size_; }
  std::size_t bytes() const noexcept;

  KvLayer layer(std::int32_t index) const;
  BlockPool& blocks() noexcept { return blocks_; }
  const BlockPool& blocks() const noexcept { return blocks_; }

 private:
  KvSpec spec_;
  std::int32_t block_size_;
  BlockPool blocks_;
  std::vector<Buffer> layers_;  // K pool then V pool of each layer
  std::vector<KvLayer> views_;
};

}  // namespace xserv::kv
