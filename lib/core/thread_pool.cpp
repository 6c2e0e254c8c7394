#include "core/thread_pool.hpp"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "core/error.hpp"

namespace xserv {
namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void ThreadPool::wait_while_equal(const std::atomic<std::uint32_t>& a, std::uint32_t old,
                                  std::condition_variable& cv) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (std::uint32_t probe = 1;; ++probe) {
    if (a.load() != old) return;
    cpu_relax();
    if (probe % 64 == 0 && clock::now() - start > std::chrono::microseconds(spin_us_)) break;
  }
  std::unique_lock lock(sleep_mutex_);
  sleepers_.fetch_add(1);
  cv.wait(lock, [&] { return a.load() != old; });
  sleepers_.fetch_sub(1);
}

void ThreadPool::wake(std::condition_variable& cv, bool all) {
  if (sleepers_.load() == 0) return;
  std::lock_guard lock(sleep_mutex_);  // a sleeper is either in cv.wait or will see the value
  if (all) cv.notify_all();
  else cv.notify_one();
}

std::size_t ThreadPool::max_threads() noexcept {
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp<std::size_t>(4 * hw, 4, kAbsoluteMaxThreads);
}

ThreadPool::ThreadPool(std::size_t threads, std::uint32_t spin_us) : spin_us_(spin_us) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  XSERV_CHECK(threads <= max_threads(), ErrorCode::invalid_argument,
              "{} threads asked; at most {} here (4 per hardware thread, never more than {})",
              threads, max_threads(), kAbsoluteMaxThreads);
  workers_.reserve(threads - 1);
  for (std::size_t i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error& e) {
      // The destructor will not run for a constructor that throws: stop what was started here,
      // or joinable std::threads would terminate the host.
      const std::size_t started = workers_.size() + 1;
      stop_workers();
      throw_error(ErrorCode::resource_exhausted,
                  "cannot start thread {} of {} (the system refused: {}); ask for fewer threads",
                  started + 1, threads, e.what());
    } catch (...) {
      stop_workers();
      throw;
    }
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() noexcept {
  stop_.store(true);
  generation_.fetch_add(1);
  wake(work_cv_, true);
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void ThreadPool::run_chunks(std::uint32_t generation) noexcept {
  for (;;) {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    if (static_cast<std::uint32_t>(s >> 32) != generation) return;
    const auto index = static_cast<std::uint32_t>(s);
    const std::uint32_t chunks = chunks_.load(std::memory_order_relaxed);
    if (index >= chunks) return;
    const Fn* fn = fn_.load(std::memory_order_relaxed);
    const std::size_t n = n_.load(std::memory_order_relaxed);
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
    const std::size_t begin = n * index / chunks, end = n * (index + 1) / chunks;
    try {
      if (begin < end) (*fn)(begin, end);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    if (done_.fetch_add(1) + 1 == chunks) wake(done_cv_, false);
  }
}

void ThreadPool::worker_loop() {
  std::uint32_t seen = 0;
  for (;;) {
    wait_while_equal(generation_, seen, work_cv_);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    run_chunks(seen);
  }
}

void ThreadPool::parallel_for(std::size_t n, const Fn& fn, std::size_t grain) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  const std::size_t chunks = std::min(4 * size(), std::max<std::size_t>(n / grain, 1));
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard loop_lock(loop_mutex_);
  const std::uint32_t generation = ++last_generation_;
  fn_.store(&fn, std::memory_order_relaxed);
  n_.store(n, std::memory_order_relaxed);
  chunks_.store(static_cast<std::uint32_t>(chunks), std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  state_.store(static_cast<std::uint64_t>(generation) << 32, std::memory_order_release);
  generation_.store(generation);
  wake(work_cv_, true);
  run_chunks(generation);
  for (std::uint32_t d; (d = done_.load(std::memory_order_acquire)) != chunks;)
    wait_while_equal(done_, d, done_cv_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace xserv
