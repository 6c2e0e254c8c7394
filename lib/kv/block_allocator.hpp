// BlockAllocator: a fixed pool of KV-cache block ids [0, num_blocks).
//
// Ids are handed out from a free list (last freed, first reused, which keeps recently touched
// blocks warm in cache). The pool never grows: when it is empty, allocate() throws
// Error(resource_exhausted) so the caller (the generator, later the scheduler) can decide what to
// do. A full scheduler with ref counts and a prefix cache is a later issue.
#pragma once

#include <cstdint>
#include <vector>

namespace xserv::kv {

class BlockAllocator {
 public:
  explicit BlockAllocator(std::int32_t num_blocks = 0);

  std::int32_t num_blocks() const noexcept { return num_blocks_; }
  std::int32_t num_free() const noexcept { return static_cast<std::int32_t>(free_.size()); }
  std::int32_t num_used() const noexcept { return num_blocks_ - num_free(); }

  // Throws Error(resource_exhausted) naming the pool size when no block is free.
  std::int32_t allocate();
  // Throws Error(invalid_argument) for an id outside the pool or one that is already free.
  void free(std::int32_t block);

 private:
  std::int32_t num_blocks_ = 0;
  std::vector<std::int32_t> free_;
  std::vector<std::uint8_t> in_use_;  // guards against double frees
};

// The blocks one sequence owns, in order: token at position p lives in blocks()[p / block_size]
// at offset p % block_size.
class BlockTable {
 public:
  explicit BlockTable(std::int32_t block_size) : block_size_(block_size) {}

  const std::vector<std::int32_t>& blocks() const noexcept { return blocks_; }
  std::int32_t block_size() const noexcept { return block_size_; }
  std::int32_t capacity() const noexcept {
    return static_cast<std::int32_t>(blocks_.size()) * block_size_;
  }

  // Allocates blocks until `tokens` tokens fit. On resource_exhausted the blocks already owned
  // stay owned (release() frees them).
  void ensure_capacity(BlockAllocator& pool, std::int32_t tokens);
  // The cache slot (block * block_size + offset) of position `pos`, which must be < capacity().
  std::int32_t slot(std::int32_t pos) const;
  // Returns every block to the pool.
  void release(BlockAllocator& pool) noexcept;

 private:
  std::int32_t block_size_;
  std::vector<std::int32_t> blocks_;
};

}  // namespace xserv::kv
