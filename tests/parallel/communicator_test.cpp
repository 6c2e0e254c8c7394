// The in-process host communicator (the CPU reference of an all-reduce), RankWorkers, and the
// NCCL loader's errors on a machine without NCCL (CI).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "parallel/communicator.hpp"
#include "parallel/nccl_communicator.hpp"
#include "parallel/rank_workers.hpp"
#include "support/scoped_env.hpp"

using namespace xserv;

TEST_CASE("host all_reduce_sum gives every rank the sum, in f32, bf16 and f16", "[parallel][threads]") {
  for (int size : {1, 2, 3, 4}) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      INFO("size " << size << " dtype " << dtype_name(dtype));
      auto comms = make_host_communicators(size);
      REQUIRE(static_cast<int>(comms.size()) == size);
      const std::size_t n = 37;  // not a multiple of the size: uneven shares
      std::vector<std::vector<std::uint16_t>> raw(static_cast<std::size_t>(size),
                                                  std::vector<std::uint16_t>(2 * n));
      RankWorkers workers(size);
      for (int r = 0; r < size; ++r) {
        CHECK(comms[static_cast<std::size_t>(r)]->rank() == r);
        CHECK(comms[static_cast<std::size_t>(r)]->size() == size);
      }
      // No Catch2 assertion inside the ranks' threads: Catch2 is not thread-safe.
      workers.run([&](int r) {
        auto& mem = raw[static_cast<std::size_t>(r)];
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((r + 1) * static_cast<int>(i % 8));
        convert_from_f32(v.data(), mem.data(), dtype, n);
        // Two reductions in a row: the second must not overtake the first.
        for (int round = 0; round < 2; ++round)
          comms[static_cast<std::size_t>(r)]->all_reduce_sum(
              Tensor(mem.data(), dtype, {static_cast<std::int64_t>(n)}));
      });
      // Small integers are exact in every dtype: sum over ranks of (r + 1) * k, then doubled.
      const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
      for (int r = 0; r < size; ++r) {
        std::vector<float> got(n);
        convert_to_f32(raw[static_cast<std::size_t>(r)].data(), dtype, got.data(), n);
        const float factor = size > 1 ? static_cast<float>(size) : 1.0f;
        for (std::size_t i = 0; i < n; ++i)
          CHECK(got[i] == ranks_sum * static_cast<float>(i % 8) * factor);
      }
    }
  }
}

TEST_CASE("host communicators refuse a bad size, mismatched tensors and wake peers on abort",
          "[parallel][threads]") {
  CHECK_THROWS_MATCHES(make_host_communicators(0), Error,
                       Catch::Matchers::Predicate<Error>(
                           [](const Error& e) { return e.code() == ErrorCode::invalid_argument; }));
  auto comms = make_host_communicators(2);
  RankWorkers workers(2);
  float a[4] = {}, b[3] = {};
  CHECK_THROWS_AS(workers.run([&](int r) {
    if (r == 0) comms[0]->all_reduce_sum(Tensor(a, DType::f32, {4}));
    else comms[1]->all_reduce_sum(Tensor(b, DType::f32, {3}));
  }), Error);

  // A rank that fails before its collective: the other is woken by abort, not left waiting.
  auto fresh = make_host_communicators(2);
  try {
    workers.run(
        [&](int r) {
          if (r == 1) throw_error(ErrorCode::out_of_memory, "rank 1 ran out of memory");
          fresh[0]->all_reduce_sum(Tensor(a, DType::f32, {4}));
        },
        [&] { fresh[0]->abort(); });
    FAIL("expected an error");
  } catch (const Error& e) {
    // The cause is rethrown, not rank 0's "cancelled" that followed it.
    CHECK(e.code() == ErrorCode::out_of_memory);
  }
}

TEST_CASE("RankWorkers runs every rank at once and rethrows a rank's error",
          "[parallel][threads]") {
  CHECK_THROWS_AS(RankWorkers(0), Error);
  RankWorkers workers(3);
  std::atomic<int> seen{0};
  std::vector<std::thread::id> ids(3);
  for (int round = 0; round < 5; ++round)
    workers.run([&](int r) {
      ids[static_cast<std::size_t>(r)] = std::this_thread::get_id();
      seen.fetch_add(1 << (r * 4));
    });
  CHECK(seen.load() == 5 * (1 + 16 + 256));
  CHECK(ids[0] == std::this_thread::get_id());
  CHECK(ids[1] != ids[0]);
  CHECK(ids[2] != ids[1]);
  try {
    workers.run([&](int r) {
      if (r == 2) throw_error(ErrorCode::internal, "rank {} failed", r);
    });
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("rank 2 failed") != std::string::npos);
  }
  workers.run([](int) {});  // usable after a failure
}

TEST_CASE("NCCL: bad device lists are refused, a missing library is a clear unsupported error",
          "[parallel]") {
  CHECK_THROWS_AS(make_nccl_communicators({}, {}), Error);
  CHECK_THROWS_AS(make_nccl_communicators({0, 1}, {nullptr}), Error);
  CHECK_THROWS_AS(make_nccl_communicators({0, 0}, {nullptr, nullptr}), Error);
  // Whatever this machine has, a library that is not there must give the clear error.
  const test::ScopedEnv env("XSERV_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
  std::string why;
  CHECK_FALSE(nccl_available(&why));
  CHECK(why.find("/nonexistent/libnccl.so.2") != std::string::npos);
  try {
    make_nccl_communicators({0, 1}, {nullptr, nullptr});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("needs NCCL at run time") != std::string::npos);
  }
}
