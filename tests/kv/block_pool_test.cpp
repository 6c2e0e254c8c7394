// BlockPool on plain data: allocation order, ref counts, the null block, prefix-cache hits,
// LRU eviction and its counters, double frees.
#include <catch2/catch.hpp>

#include <vector>

#include "core/error.hpp"
#include "kv/block_pool.hpp"

using namespace xserv;
using namespace xserv::kv;

namespace {
std::vector<std::int32_t> block_tokens(std::int32_t first, std::int32_t n = 4) {
  std::vector<std::int32_t> t;
  for (std::int32_t i = 0; i < n; ++i) t.push_back(first + i);
  return t;
}
}  // namespace

TEST_CASE("BlockPool hands out every block but the null one, once", "[kv]") {
  BlockPool pool(4, 4);
  CHECK(pool.num_free() == 3);
  CHECK(pool.allocate() == 1);
  CHECK(pool.allocate() == 2);
  CHECK(pool.allocate() == 3);
  CHECK(pool.num_used() == 3);
  try {
    pool.allocate();
    FAIL("expected resource_exhausted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::resource_exhausted);
  }
  pool.release(2);
  CHECK(pool.num_free() == 1);
  CHECK(pool.allocate() == 2);
  CHECK_THROWS_AS(BlockPool(1, 4), Error);
  CHECK_THROWS_AS(BlockPool(4, 0), Error);
}

TEST_CASE("BlockPool ref counts: a shared block is free after its last release", "[kv]") {
  BlockPool pool(3, 4);
  const auto a = pool.allocate();
  pool.ref(a);
  CHECK(pool.ref_count(a) == 2);
  pool.release(a);
  CHECK(pool.num_free() == 1);  // still held once
  pool.release(a);
  CHECK(pool.num_free() == 2);
  CHECK_THROWS_AS(pool.release(a), Error);  // double free
  CHECK_THROWS_AS(pool.ref(a), Error);      // ref of a free block
  CHECK_THROWS_AS(pool.release(BlockPool::null_block), Error);
  CHECK_THROWS_AS(pool.release(3), Error);  // outside the pool
  CHECK_THROWS_AS(pool.release(-1), Error);
  CHECK(pool.num_free() == 2);
}

TEST_CASE("BlockPool prefix cache: hits after release, chain hashes, token check", "[kv]") {
  BlockPool pool(5, 4);
  const auto t1 = block_tokens(10), t2 = block_tokens(20);
  const auto h1 = BlockPool::hash_block(BlockPool::root_hash, t1);
  const auto h2 = BlockPool::hash_block(h1, t2);
  CHECK(h2 != BlockPool::hash_block(BlockPool::root_hash, t2));  // the parent matters
  CHECK(pool.lookup(h1, t1) == -1);
  const auto a = pool.allocate(), b = pool.allocate();
  pool.commit(a, h1, t1);
  pool.commit(b, h2, t2);
  CHECK(pool.num_cached() == 2);

  // Shared while held: a second sequence takes a reference.
  CHECK(pool.lookup(h1, t1) == a);
  CHECK(pool.ref_count(a) == 2);
  pool.release(a);
  // Released by everyone: still cached, found again and taken out of the free queue.
  pool.release(a);
  pool.release(b);
  CHECK(pool.num_free() == 4);
  CHECK(pool.lookup(h1, t1) == a);
  CHECK(pool.num_free() == 3);
  CHECK(pool.lookup(h2, t2) == b);
  // Same hash, other tokens (as a collision would look): a miss.
  CHECK(pool.lookup(h1, block_tokens(99)) == -1);
  CHECK(pool.queries() == 5);
  CHECK(pool.hits() == 3);
  CHECK(pool.evictions() == 0);
  pool.release(a);
  pool.release(b);
}

TEST_CASE("BlockPool evicts cached blocks only when reused, least recently released first",
          "[kv]") {
  BlockPool pool(4, 4);  // blocks 1, 2, 3
  const auto t1 = block_tokens(1), t2 = block_tokens(2);
  const auto h1 = BlockPool::hash_block(BlockPool::root_hash, t1);
  const auto h2 = BlockPool::hash_block(BlockPool::root_hash, t2);
  const auto a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  pool.commit(a, h1, t1);
  pool.commit(b, h2, t2);
  pool.release(a);  // cached: to the back
  pool.release(b);  // cached: to the back, after a
  pool.release(c);  // not cached: to the front, reused first
  CHECK(pool.allocate() == c);
  CHECK(pool.evictions() == 0);
  CHECK(pool.allocate() == a);  // the least recently released cached block goes first
  CHECK(pool.evictions() == 1);
  CHECK(pool.lookup(h1, t1) == -1);
  CHECK(pool.lookup(h2, t2) == b);
  CHECK(pool.num_cached() == 1);
  CHECK(pool.num_used() == 3);

  // With caching off nothing is kept or found.
  BlockPool off(3, 4, false);
  const auto x = off.allocate();
  off.commit(x, h1, t1);
  off.release(x);
  CHECK(off.lookup(h1, t1) == -1);
  CHECK(off.num_cached() == 0);
  CHECK(off.queries() == 0);
}

TEST_CASE("BlockTable maps positions to slots through its blocks", "[kv]") {
  BlockPool pool(9, 4);  // blocks 1 ..= 8
  pool.allocate();       // block 1 taken by someone else
  BlockTable t(4);
  t.ensure_capacity(pool, 6);
  REQUIRE(t.blocks().size() == 2);
  CHECK(t.capacity() == 8);
  CHECK(t.slot(0) == t.blocks()[0] * 4);
  CHECK(t.slot(5) == t.blocks()[1] * 4 + 1);
  CHECK_THROWS_AS(t.slot(8), Error);
  t.ensure_capacity(pool, 8);  // already fits
  CHECK(t.blocks().size() == 2);
  t.release(pool);
  CHECK(t.blocks().empty());
  CHECK(pool.num_free() == 7);

  BlockTable big(4);
  CHECK_THROWS_AS(big.ensure_capacity(pool, 4 * 8), Error);  // 7 free blocks only
  big.release(pool);
  CHECK(pool.num_free() == 7);
}
