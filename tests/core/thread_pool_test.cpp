#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <chrono>
#include <thread>
#include <catch2/catch.hpp>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"
#include "core/thread_pool.hpp"
#include "support/resource_limits.hpp"

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
  // Catch2's CHECK is not thread-safe (ThreadSanitizer caught one in a chunk): the chunks only
  // record, the test thread checks.
  std::atomic<std::size_t> smallest{100};
  for (int round = 0; round < 200; ++round) {
    pool.parallel_for(100, [&](std::size_t b, std::size_t e) {
      std::size_t seen = smallest.load();
      while (e - b < seen && !smallest.compare_exchange_weak(seen, e - b)) {
      }
      for (std::size_t i = b; i < e; ++i) total += static_cast<long>(i);
    }, 10);
  }
  CHECK(smallest >= 10);
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

TEST_CASE("ThreadPool refuses a thread count past its cap", "[core][threads]") {
  const std::size_t cap = ThreadPool::max_threads();
  CHECK(cap >= 4);
  CHECK(cap <= ThreadPool::kAbsoluteMaxThreads);
  for (std::size_t n : {cap + 1, std::size_t{100000}}) {
    try {
      ThreadPool pool(n);
      FAIL("made " << n << " threads");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains(std::to_string(n)) && Catch::Contains("threads"));
    }
  }
}

// A sanitizer's runtime reserves terabytes of address space, so RLIMIT_AS cannot be lowered
// under one; the C API test (tests/capi/capi_hostile_test.c) covers the same path from C.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define XSERV_TEST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define XSERV_TEST_UNDER_SANITIZER 1
#endif
#endif

TEST_CASE("ThreadPool fails cleanly when the system refuses a thread part-way", "[core][threads]") {
#ifdef XSERV_TEST_UNDER_SANITIZER
  SUCCEED("skipped under a sanitizer");
#else
  // In a child process: the address space is capped just above what it uses, so thread stacks
  // run out after the first worker. The constructor must throw resource_exhausted (not hang, not
  // terminate); alarm() turns a hang into a failure.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::alarm(30);
    // Room for one worker's stack and a half: the second worker cannot start.
    test::limit_address_space(test::default_thread_stack_bytes() * 3 / 2);
    try {
      ThreadPool pool(ThreadPool::max_threads());
      ::_exit(2);  // the limit did not bite
    } catch (const Error& e) {
      ::_exit(e.code() == ErrorCode::resource_exhausted &&
                      std::string(e.what()).find("cannot start thread") != std::string::npos
                  ? 0
                  : 3);
    } catch (...) {
      ::_exit(4);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child status " << status << " (exit 2: the limit did not bite, 3: wrong error)");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
#endif
}
TEST_CASE("parallel_for from a busy caller still runs every chunk once", "[core][threads]") {
  // Chunks are claimed dynamically: the caller may run them all before a worker wakes up, and a
  // slow chunk must not make another one run twice. Many short loops back to back exercise the
  // hand-off between loops (a late worker must never run a chunk of a finished loop).
  ThreadPool pool(3);
  for (int round = 0; round < 2000; ++round) {
    const std::size_t n = 1 + static_cast<std::size_t>(round % 37);
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
      if (round % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      for (std::size_t i = b; i < e; ++i) hits[i]++;
    });
    for (std::size_t i = 0; i < n; ++i) REQUIRE(hits[i] == 1);
  }
}

namespace {

// Aborts the test binary with a message when a stress case hangs (a lost wake-up shows as a
// hang; better a clear failure than a CI timeout).
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit)
      : thread_([this, limit] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "thread pool stress: no progress in %lld s (a lost wake-up?)\n",
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Many tiny loops on `pool` from this thread: every index covered exactly once, sizes 1..41,
// an occasional slow chunk (so workers reach the sleep path mid-loop), an occasional throwing
// loop, and a nested parallel_for on the same pool (runs inline) and on `other` when given
// (nesting goes one way only: two pools calling into each other would deadlock, as two mutexes
// taken in opposite orders do).
// Returns the number of failed checks (Catch2's macros are not thread-safe).
int hammer(ThreadPool& pool, ThreadPool* other, int rounds, unsigned seed) {
  int failures = 0;
  std::vector<std::atomic<int>> hits(64);
  for (int round = 0; round < rounds; ++round) {
    const unsigned r = seed * 2654435761u + static_cast<unsigned>(round) * 40503u;
    const std::size_t n = 1 + r % 41;
    const bool slow = r % 97 == 0, nested = r % 13 == 0, throws = r % 211 == 0;
    for (std::size_t i = 0; i < n; ++i) hits[i] = 0;
    try {
      pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
        if (slow && b == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        if (nested) {
          std::atomic<std::size_t> inner{0};
          pool.parallel_for(8, [&](std::size_t ib, std::size_t ie) { inner += ie - ib; });
          if (other)
            other->parallel_for(5, [&](std::size_t ib, std::size_t ie) { inner += ie - ib; });
          if (inner != (other ? 13u : 8u)) hits[b] += 1000;
        }
        for (std::size_t i = b; i < e; ++i) hits[i]++;
        if (throws && e == n) throw std::runtime_error("chunk failed");
      });
      if (throws) ++failures;  // the exception was lost
    } catch (const std::runtime_error&) {
      if (!throws) ++failures;
    }
    for (std::size_t i = 0; i < n; ++i) failures += hits[i] != 1;
  }
  return failures;
}

}  // namespace

TEST_CASE("ThreadPool stress: thousands of tiny loops from several callers and pools",
          "[core][threads]") {
  // Two pools, each driven by two caller threads at once (calls serialise), chunks of a that
  // call into b, slow chunks and exceptions. spin 0: every idle worker and waiting
  // caller takes the sleep path, the hand-off most prone to a lost wake-up; the default polls
  // first.
  const Watchdog watchdog(std::chrono::seconds(300));
  for (const std::uint32_t spin_us : {0u, 20u}) {
    for (const std::uint32_t chunks_per_thread : {1u, 4u}) {
      ThreadPool::Options options;
      options.spin_us = spin_us;
      options.chunks_per_thread = chunks_per_thread;
      ThreadPool a(3, options), b(2, options);
      std::atomic<int> failures{0};
      std::vector<std::thread> callers;
      for (unsigned c = 0; c < 4; ++c)
        callers.emplace_back([&, c] {
          failures += hammer(c % 2 ? b : a, c % 2 ? nullptr : &b, 1500, c + 1 + 7 * spin_us);
        });
      for (auto& t : callers) t.join();
      INFO("spin_us " << spin_us << ", chunks per thread " << chunks_per_thread);
      CHECK(failures == 0);
    }
  }
}

TEST_CASE("ThreadPool stress: a pool made and destroyed while its workers wake",
          "[core][threads]") {
  // Destruction right after a loop (workers still polling, sleeping or finishing their wake-up
  // call) must join cleanly.
  const Watchdog watchdog(std::chrono::seconds(120));
  for (int round = 0; round < 300; ++round) {
    ThreadPool::Options options;
    options.spin_us = static_cast<std::uint32_t>(round % 3) * 10;
    ThreadPool pool(1 + round % 4, options);
    std::atomic<int> sum{0};
    for (int loop = 0; loop < round % 5; ++loop)
      pool.parallel_for(16, [&](std::size_t b, std::size_t e) { sum += static_cast<int>(e - b); });
    REQUIRE(sum == 16 * (round % 5));
  }
}
