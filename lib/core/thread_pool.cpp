#include "core/thread_pool.hpp"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "core/error.hpp"

namespace xserv {
namespace {

// state_: generation (high 40 bits) | chunk count (12 bits) | next chunk to claim (12 bits).
constexpr unsigned kIndexBits = 12;
constexpr std::uint64_t kIndexMask = (std::uint64_t{1} << kIndexBits) - 1;
constexpr std::size_t kMaxChunks = kIndexMask;  // 4095: next may reach the count

constexpr std::uint64_t pack(std::uint64_t generation, std::uint64_t chunks) {
  return generation << (2 * kIndexBits) | chunks << kIndexBits;
}
constexpr std::uint32_t chunks_of(std::uint64_t s) {
  return static_cast<std::uint32_t>(s >> kIndexBits & kIndexMask);
}
constexpr std::uint32_t next_of(std::uint64_t s) {
  return static_cast<std::uint32_t>(s & kIndexMask);
}

// The pool whose chunk this thread is running: a parallel_for on it from there runs inline.
thread_local const ThreadPool* running_pool = nullptr;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls done() with a pause per probe for up to spin_us (microseconds) from the start; true once
// done() holds. spin_us is re-read at every clock check, so a poll already under way when the
// owner shortens it (set_spin_us after a step's sample) ends by the new deadline.
template <typename Done>
bool poll(const std::atomic<std::uint32_t>& spin_us, Done done) {
  using clock = std::chrono::steady_clock;
  if (done()) return true;
  if (spin_us.load(std::memory_order_relaxed) == 0) return false;
  const auto start = clock::now();
  for (std::uint32_t probe = 1;; ++probe) {
    cpu_relax();
    if (done()) return true;
    if (probe % 32 == 0 &&
        clock::now() - start > std::chrono::microseconds(spin_us.load(std::memory_order_relaxed)))
      return false;
  }
}

}  // namespace

std::size_t ThreadPool::max_threads() noexcept {
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp<std::size_t>(4 * hw, 4, kAbsoluteMaxThreads);
}

ThreadPool::ThreadPool(std::size_t threads, Options options)
    : options_(options), spin_us_(options.spin_us) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  XSERV_CHECK(threads <= max_threads(), ErrorCode::invalid_argument,
              "{} threads asked; at most {} here (4 per hardware thread, never more than {})",
              threads, max_threads(), kAbsoluteMaxThreads);
  options_.chunks_per_thread = std::max<std::uint32_t>(options_.chunks_per_thread, 1);
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
  {
    std::lock_guard lock(sleep_mutex_);  // a sleeper is in work_cv_.wait or sees stop_
    work_cv_.notify_all();
  }
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

bool ThreadPool::claimable() const noexcept {
  const std::uint64_t s = state_.load();
  return next_of(s) < chunks_of(s);
}

void ThreadPool::run_chunk(std::uint64_t state) noexcept {
  // Claimed: the loop stays current until this chunk is counted below.
  const std::size_t chunks = chunks_of(state), index = next_of(state);
  const std::size_t begin = n_ * index / chunks, end = n_ * (index + 1) / chunks;
  const ThreadPool* outer = running_pool;
  running_pool = this;
  try {
    if (begin < end) (*fn_)(begin, end);
  } catch (...) {
    std::lock_guard lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  running_pool = outer;
  if (remaining_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
    std::lock_guard lock(sleep_mutex_);  // the caller is in done_cv_.wait or sees 0 first
    done_cv_.notify_one();
  }
}

void ThreadPool::run_chunks() noexcept {
  std::uint64_t s = state_.load(std::memory_order_acquire);
  while (next_of(s) < chunks_of(s)) {
    if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                     std::memory_order_acquire)) {
      run_chunk(s);
      s = state_.load(std::memory_order_acquire);
    }
  }
}

void ThreadPool::wait_for_work() noexcept {
  if (poll(spin_us_, [&] { return claimable() || stop_.load(); })) return;
  std::unique_lock lock(sleep_mutex_);
  sleeping_workers_.fetch_add(1);
  work_cv_.wait(lock, [&] { return claimable() || stop_.load(); });
  sleeping_workers_.fetch_sub(1);
}

void ThreadPool::wait_for_done() noexcept {
  if (poll(spin_us_, [&] { return remaining_.load() == 0; })) return;
  std::unique_lock lock(sleep_mutex_);
  caller_sleeping_.store(true);
  done_cv_.wait(lock, [&] { return remaining_.load() == 0; });
  caller_sleeping_.store(false);
}

void ThreadPool::worker_loop() {
  for (;;) {
    wait_for_work();
    if (stop_.load()) return;
    run_chunks();
  }
}

void ThreadPool::parallel_for(std::size_t n, const Fn& fn, std::size_t grain) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  const std::size_t chunks =
      std::min({options_.chunks_per_thread * size(), std::max<std::size_t>(n / grain, 1),
                kMaxChunks});
  if (chunks <= 1 || workers_.empty() || running_pool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard loop_lock(loop_mutex_);
  fn_ = &fn;
  n_ = n;
  error_ = nullptr;
  remaining_.store(static_cast<std::uint32_t>(chunks), std::memory_order_relaxed);
  state_.store(pack(++last_generation_, chunks));  // publishes the loop (seq_cst: the handshake)
  if (sleeping_workers_.load() != 0) {
    std::lock_guard lock(sleep_mutex_);  // a sleeper is in work_cv_.wait or sees the loop
    work_cv_.notify_all();
  }
  run_chunks();
  wait_for_done();
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

}  // namespace xserv
