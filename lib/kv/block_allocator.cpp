#include "kv/block_allocator.hpp"

#include "core/error.hpp"

namespace xserv::kv {

BlockAllocator::BlockAllocator(std::int32_t num_blocks)
    : num_blocks_(num_blocks), in_use_(static_cast<std::size_t>(num_blocks > 0 ? num_blocks : 0), 0) {
  XSERV_CHECK(num_blocks >= 0, ErrorCode::invalid_argument, "block pool: {} blocks", num_blocks);
  free_.reserve(static_cast<std::size_t>(num_blocks));
  // Pushed in reverse so the first allocations return 0, 1, 2, ... (easier to read in tests).
  for (std::int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::int32_t BlockAllocator::allocate() {
  XSERV_CHECK(!free_.empty(), ErrorCode::resource_exhausted,
              "KV cache: all {} blocks are in use", num_blocks_);
  std::int32_t b = free_.back();
  free_.pop_back();
  in_use_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void BlockAllocator::free(std::int32_t block) {
  XSERV_CHECK(block >= 0 && block < num_blocks_, ErrorCode::invalid_argument,
              "KV cache: block {} is outside the pool of {}", block, num_blocks_);
  XSERV_CHECK(in_use_[static_cast<std::size_t>(block)], ErrorCode::invalid_argument,
              "KV cache: block {} freed twice", block);
  in_use_[static_cast<std::size_t>(block)] = 0;
  free_.push_back(block);
}

void BlockTable::ensure_capacity(BlockAllocator& pool, std::int32_t tokens) {
  while (capacity() < tokens) blocks_.push_back(pool.allocate());
}

std::int32_t BlockTable::slot(std::int32_t pos) const {
  XSERV_CHECK(pos >= 0 && pos < capacity(), ErrorCode::invalid_argument,
              "KV cache: position {} outside a block table of {} tokens", pos, capacity());
  return blocks_[static_cast<std::size_t>(pos / block_size_)] * block_size_ + pos % block_size_;
}

void BlockTable::release(BlockAllocator& pool) noexcept {
  for (auto b : blocks_) {
    try {
      pool.free(b);
    } catch (const Error&) {
      // A table only holds blocks it got from this pool; nothing sensible to do otherwise.
    }
  }
  blocks_.clear();
}

}  // namespace xserv::kv
