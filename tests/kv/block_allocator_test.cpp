#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "kv/block_allocator.hpp"

using namespace xserv;
using namespace xserv::kv;

TEST_CASE("BlockAllocator hands out every block once and reuses freed ones", "[kv]") {
  BlockAllocator pool(3);
  CHECK(pool.num_free() == 3);
  auto a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  CHECK(a == 0);
  CHECK(b == 1);
  CHECK(c == 2);
  CHECK(pool.num_used() == 3);
  try {
    pool.allocate();
    FAIL("expected resource_exhausted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::resource_exhausted);
    CHECK_THAT(e.what(), Catch::Contains("3 blocks"));
  }
  pool.free(b);
  CHECK(pool.allocate() == b);
  pool.free(a);
  CHECK_THROWS_AS(pool.free(a), Error);   // double free
  CHECK_THROWS_AS(pool.free(7), Error);   // not from this pool
  CHECK_THROWS_AS(pool.free(-1), Error);
  CHECK(pool.num_free() == 1);
}

TEST_CASE("BlockTable maps positions to slots through its blocks", "[kv]") {
  BlockAllocator pool(8);
  pool.allocate();  // block 0 taken by someone else
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

