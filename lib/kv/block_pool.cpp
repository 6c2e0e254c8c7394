#include "kv/block_pool.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace xserv::kv {

BlockPool::BlockPool(std::int32_t num_blocks, std::int32_t block_size, bool prefix_cache)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_cache_(prefix_cache) {
  XSERV_CHECK(num_blocks >= 2, ErrorCode::invalid_argument,
              "block pool: {} blocks (expected at least 2: the null block and one more)",
              num_blocks);
  XSERV_CHECK(block_size > 0 && block_size <= 1024, ErrorCode::invalid_argument,
              "block pool: block size {} (expected 1 ..= 1024)", block_size);
  blocks_.resize(static_cast<std::size_t>(num_blocks));
  if (prefix_cache_)
    tokens_.resize(static_cast<std::size_t>(num_blocks) * static_cast<std::size_t>(block_size));
  // The first allocations return 1, 2, 3, ... (easier to read in tests).
  for (std::int32_t b = 1; b < num_blocks; ++b) push_back(b);
}

void BlockPool::check_id(std::int32_t block, const char* what) const {
  XSERV_CHECK(block > null_block && block < num_blocks_, ErrorCode::invalid_argument,
              "block pool: {} of block {} (the pool holds 1 ..= {}; 0 is the null block)", what,
              block, num_blocks_ - 1);
}

std::int32_t BlockPool::ref_count(std::int32_t block) const {
  check_id(block, "ref count");
  return blocks_[static_cast<std::size_t>(block)].refs;
}

void BlockPool::push_front(std::int32_t b) {
  Block& x = blocks_[static_cast<std::size_t>(b)];
  x.prev = -1;
  x.next = head_;
  if (head_ >= 0) blocks_[static_cast<std::size_t>(head_)].prev = b;
  head_ = b;
  if (tail_ < 0) tail_ = b;
  x.in_queue = true;
  ++num_free_;
}

void BlockPool::push_back(std::int32_t b) {
  Block& x = blocks_[static_cast<std::size_t>(b)];
  x.next = -1;
  x.prev = tail_;
  if (tail_ >= 0) blocks_[static_cast<std::size_t>(tail_)].next = b;
  tail_ = b;
  if (head_ < 0) head_ = b;
  x.in_queue = true;
  ++num_free_;
}

void BlockPool::unlink(std::int32_t b) {
  Block& x = blocks_[static_cast<std::size_t>(b)];
  if (x.prev >= 0) blocks_[static_cast<std::size_t>(x.prev)].next = x.next;
  else head_ = x.next;
  if (x.next >= 0) blocks_[static_cast<std::size_t>(x.next)].prev = x.prev;
  else tail_ = x.prev;
  x.prev = x.next = -1;
  x.in_queue = false;
  --num_free_;
}

std::int32_t BlockPool::allocate() {
  XSERV_CHECK(head_ >= 0, ErrorCode::resource_exhausted,
              "KV cache: all {} blocks are in use", num_blocks_ - 1);
  const std::int32_t b = head_;
  unlink(b);
  Block& x = blocks_[static_cast<std::size_t>(b)];
  if (x.cached) {  // reused for new tokens: its cached prefix is gone
    by_hash_.erase(x.hash);
    x.cached = false;
    ++evictions_;
  }
  x.refs = 1;
  return b;
}

void BlockPool::ref(std::int32_t block) {
  check_id(block, "ref");
  Block& x = blocks_[static_cast<std::size_t>(block)];
  XSERV_CHECK(x.refs > 0, ErrorCode::invalid_argument, "block pool: ref of free block {}", block);
  ++x.refs;
}

void BlockPool::release(std::int32_t block) {
  check_id(block, "release");
  Block& x = blocks_[static_cast<std::size_t>(block)];
  XSERV_CHECK(x.refs > 0, ErrorCode::invalid_argument, "block pool: block {} released twice",
              block);
  if (--x.refs > 0) return;
  if (x.cached) push_back(block);
  else push_front(block);
}

std::uint64_t BlockPool::hash_block(std::uint64_t parent,
                                    std::span<const std::int32_t> tokens) noexcept {
  // FNV-1a style mixing of 64-bit words, finished with a splitmix64 round.
  std::uint64_t h = parent ^ 0xcbf29ce484222325ull;
  for (std::int32_t t : tokens) {
    h ^= static_cast<std::uint32_t>(t);
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  h ^= static_cast<std::uint64_t>(tokens.size()) << 48;
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::span<const std::int32_t> BlockPool::stored_tokens(std::int32_t b) const {
  return std::span<const std::int32_t>(tokens_).subspan(
      static_cast<std::size_t>(b) * static_cast<std::size_t>(block_size_),
      static_cast<std::size_t>(block_size_));
}

std::int32_t BlockPool::lookup(std::uint64_t hash, std::span<const std::int32_t> tokens) {
  if (!prefix_cache_) return -1;
  ++queries_;
  const auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  const std::int32_t b = it->second;
  const auto stored = stored_tokens(b);
  if (tokens.size() != stored.size() || !std::equal(tokens.begin(), tokens.end(), stored.begin()))
    return -1;  // a hash collision: treat as a miss
  Block& x = blocks_[static_cast<std::size_t>(b)];
  if (x.in_queue) unlink(b);
  ++x.refs;
  ++hits_;
  return b;
}

void BlockPool::commit(std::int32_t block, std::uint64_t hash,
                       std::span<const std::int32_t> tokens) {
  check_id(block, "commit");
  XSERV_CHECK(static_cast<std::int32_t>(tokens.size()) == block_size_,
              ErrorCode::invalid_argument, "block pool: commit of {} tokens into a block of {}",
              tokens.size(), block_size_);
  Block& x = blocks_[static_cast<std::size_t>(block)];
  XSERV_CHECK(x.refs > 0, ErrorCode::invalid_argument, "block pool: commit of free block {}",
              block);
  if (!prefix_cache_ || x.cached || by_hash_.count(hash)) return;
  by_hash_.emplace(hash, block);
  x.cached = true;
  x.hash = hash;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<std::ptrdiff_t>(block) * block_size_);
}

void BlockTable::ensure_capacity(BlockPool& pool, std::int32_t tokens) {
  while (capacity() < tokens) blocks_.push_back(pool.allocate());
}

std::int32_t BlockTable::slot(std::int32_t pos) const {
  XSERV_CHECK(pos >= 0 && pos < capacity(), ErrorCode::invalid_argument,
              "KV cache: position {} outside a block table of {} tokens", pos, capacity());
  return blocks_[static_cast<std::size_t>(pos / block_size_)] * block_size_ + pos % block_size_;
}

void BlockTable::release(BlockPool& pool) noexcept {
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    try {
      pool.release(*it);
    } catch (const Error&) {
      // A table only holds blocks it got from this pool.
    }
  }
  blocks_.clear();
}

}  // namespace xserv::kv
