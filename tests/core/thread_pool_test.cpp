#include <atomic>
#include <catch2/catch.hpp>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.hpp"

using namespace xserv;

TEST_CASE("parallel_for covers every index exactly once", "[core][threads]") {
  ThreadPool pool(4);
  CHECK(pool.size() == 4);
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 1000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) hits[i]++;
    });
    for (std::size_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
  }
}

TEST_CASE("parallel_for is reusable many times and respects the grain", "[core][threads]") {
  ThreadPool pool(3);
  std::atomic<long> total{0};
  for (int round = 0; round < 200; ++round) {
    pool.parallel_for(100, [&](std::size_t b, std::size_t e) {
      CHECK(e - b >= 10);
      for (std::size_t i = b; i < e; ++i) total += static_cast<long>(i);
    }, 10);
  }
  CHECK(total == 200L * 4950L);
}

TEST_CASE("parallel_for rethrows an exception from a chunk", "[core][threads]") {
  ThreadPool pool(2);
  CHECK_THROWS_AS(pool.parallel_for(10, [](std::size_t b, std::size_t) {
    if (b == 0) throw std::runtime_error("boom");
  }), std::runtime_error);
  // The pool still works afterwards.
  std::atomic<int> n{0};
  pool.parallel_for(10, [&](std::size_t b, std::size_t e) { n += static_cast<int>(e - b); });
  CHECK(n == 10);
}
