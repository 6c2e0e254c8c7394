// BlockPool: the engine's KV block ids, ref-counted, with a prefix cache.
//
// Mechanism only; who gets blocks and who is preempted is the scheduler's policy.
//
// - Sized once: ids [0, num_blocks). Block 0 is the null block: never handed out, the block that
//   padding rows of a batch write to and read from, so a padded batch needs no free block.
// - Ref counts: a block is held by every sequence whose block table names it (samples of one
//   request share their prompt's blocks, requests share cached prefixes). release() drops one
//   reference; a block whose count reaches 0 goes to the free queue.
// - Prefix cache: a full block whose tokens are known is committed under
//   hash(parent block's hash, its token ids); lookup() finds it again by the same chain. A
//   released block keeps its hash while it sits in the free queue, so a later request with the
//   same prefix takes it back (a hit) instead of recomputing; the hash is dropped (an eviction)
//   only when allocate() reuses the block for something else.
// - Free queue, LRU: allocate() takes from the front. Released blocks that hold a cached prefix
//   go to the back (least recently used evicted first); released blocks without one go to the
//   front, so they are reused before any cached block is evicted.
// - Hits compare the stored token ids too, so a 64-bit hash collision can never hand out the
//   wrong K/V.
//
// Invariants: every id except 0 is either in the free queue (ref 0) or referenced (ref > 0),
// never both; num_free() + num_used() == num_blocks() - 1. Not thread-safe (the engine's step
// thread owns it).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace xserv::kv {

class BlockPool {
 public:
  static constexpr std::int32_t null_block = 0;
  // The chain's start: the parent hash of a sequence's first block.
  static constexpr std::uint64_t root_hash = 0x9e3779b97f4a7c15ull;

  // num_blocks counts the null block (at least 2). Throws Error(invalid_argument) otherwise.
  BlockPool(std::int32_t num_blocks, std::int32_t block_size, bool prefix_cache = true);

  std::int32_t num_blocks() const noexcept { return num_blocks_; }  // the null block included
  std::int32_t block_size() const noexcept { return block_size_; }
  bool prefix_cache() const noexcept { return prefix_cache_; }
  std::int32_t num_free() const noexcept { return num_free_; }  // allocatable now
  std::int32_t num_used() const noexcept { return num_blocks_ - 1 - num_free_; }
  std::int32_t ref_count(std::int32_t block) const;

  // A free block with one reference; a cached one evicts its hash. Throws
  // Error(resource_exhausted) when none is free.
  std::int32_t allocate();
  // One more reference to a block that is held (sharing). Throws Error(invalid_argument) for a
  // free block, the null block or an id outside the pool.
  void ref(std::int32_t block);
  // Drops one reference. Throws Error(invalid_argument) for a block that is not held (a double
  // free), the null block or an id outside the pool.
  void release(std::int32_t block);

  // The hash of a full block with `tokens` (block_size ids) after the block hashed `parent`.
  static std::uint64_t hash_block(std::uint64_t parent, std::span<const std::int32_t> tokens) noexcept;
  // The cached block with this hash and tokens, with one reference taken for the caller (taken
  // out of the free queue when it was there), or -1. Counts a query, and a hit when found.
  std::int32_t lookup(std::uint64_t hash, std::span<const std::int32_t> tokens);
  // Records that held block `block` now holds the full block `tokens` hashed `hash`. A no-op when
  // caching is off, when the block is already cached, or when another block holds that hash.
  void commit(std::int32_t block, std::uint64_t hash, std::span<const std::int32_t> tokens);

  std::uint64_t queries() const noexcept { return queries_; }
  std::uint64_t hits() const noexcept { return hits_; }
  std::uint64_t evictions() const noexcept { return evictions_; }
  std::int32_t num_cached() const noexcept { return static_cast<std::int32_t>(by_hash_.size()); }

 private:
  struct Block {
    std::int32_t refs = 0;
    std::int32_t prev = -1, next = -1;  // free-queue links; -1 ends
    bool in_queue = false;
    bool cached = false;
    std::uint64_t hash = 0;
  };
  void check_id(std::int32_t block, const char* what) const;
  void push_front(std::int32_t b);
  void push_back(std::int32_t b);
  void unlink(std::int32_t b);
  std::span<const std::int32_t> stored_tokens(std::int32_t b) const;

  std::int32_t num_blocks_;
  std::int32_t block_size_;
  bool prefix_cache_;
  std::vector<Block> blocks_;
  std::vector<std::int32_t> tokens_;  // [num_blocks * block_size]: a cached block's ids
  std::int32_t head_ = -1, tail_ = -1;
  std::int32_t num_free_ = 0;
  std::unordered_map<std::uint64_t, std::int32_t> by_hash_;
  std::uint64_t queries_ = 0, hits_ = 0, evictions_ = 0;
};

// The blocks one sequence owns, in order: the token at position p lives in
// blocks()[p / block_size] at offset p % block_size. For tools and tests that drive
// Model::forward directly; the engine's sequences keep their block lists themselves.
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
  void ensure_capacity(BlockPool& pool, std::int32_t tokens);
  // The cache slot (block * block_size + offset) of position `pos`, which must be < capacity().
  std::int32_t slot(std::int32_t pos) const;
  // Returns every block to the pool.
  void release(BlockPool& pool) noexcept;

 private:
  std::int32_t block_size_;
  std::vector<std::int32_t> blocks_;
};

}  // namespace xserv::kv
