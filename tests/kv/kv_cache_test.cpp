#include <catch2/catch.hpp>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "kv/kv_cache.hpp"

using namespace xserv;
using namespace xserv::kv;

TEST_CASE("KvCache sizes its pools from a block count or a memory budget", "[kv]") {
  auto backend = make_backend(DeviceKind::cpu, {1, 0});
  KvSpec spec{2, 2, 8, DType::f32};
  CHECK(spec.bytes_per_block(4) == 2u * 2 * 4 * 2 * 8 * 4);
  KvCache by_count(*backend, spec, {4, 5, 0});
  CHECK(by_count.num_blocks() == 5);
  CHECK(by_count.capacity_tokens() == 20);
  KvLayer l = by_count.layer(1);
  CHECK(l.k.shape == Shape{5, 4, 2, 8});
  CHECK(l.block_size() == 4);
  CHECK(by_count.bytes() == 5 * spec.bytes_per_block(4));

  KvCache by_budget(*backend, spec, {4, 0, spec.bytes_per_block(4) * 3 + 17});
  CHECK(by_budget.num_blocks() == 3);

  CHECK_THROWS_AS(KvCache(*backend, spec, {4, 0, 10}), Error);      // budget below one block
  CHECK_THROWS_AS(KvCache(*backend, spec, {0, 4, 0}), Error);       // block size 0
  CHECK_THROWS_AS(KvCache(*backend, KvSpec{0, 2, 8, DType::f32}, {4, 4, 0}), Error);
  CHECK_THROWS_AS(by_count.layer(2), Error);
}
