// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops).
//
// parallel_for splits [0, n) into contiguous chunks and returns when every chunk is done; the
// calling thread takes part. Calls are serialised: one loop runs at a time, which is what a
// forward pass needs (ops run one after another, each using all cores). A parallel_for called
// from inside a chunk of the same pool runs inline on that thread (it cannot deadlock).
//
// Hand-off, for an idle machine and a crowded one (a game, a shared build box):
// - A decode step of a small model is dozens of loops of a few microseconds each, so waking
//   sleeping workers through the kernel for every loop costs more than the work. A worker that
//   finished polls for the next loop for spin_us (a pause per probe, never sched_yield: a yield
//   hands the core away for a whole time slice on a crowded machine), then sleeps on a condition
//   variable. The caller waiting for the last chunks does the same.
// - Chunks are claimed, not assigned: up to chunks_per_thread per thread, taken in order by
//   whichever thread runs. A worker the OS descheduled claims nothing and the others run its
//   share, so a loop waits only for chunks already being run.
//
// Correct by construction (no lost wake-up, no chunk of a finished loop):
// - One 64-bit word holds the loop: generation (40 bits) | chunk count | next chunk to claim.
//   A chunk is claimed by a compare-exchange of the whole word, so a claim succeeds only while
//   that loop is the current one and has the chunk unclaimed; the loop's caller cannot return
//   (and replace fn/n) before that chunk is counted done, so the claimer reads fn/n safely after
//   its claim. A thread that slept through loops simply finds nothing to claim.
// - remaining_ counts the loop's unfinished chunks; it is reset only by the next loop's caller,
//   after it saw 0, when no chunk of the old loop can still be running.
// - Sleeping is a Dekker handshake: the sleeper announces itself (seq_cst) under the sleep mutex
//   and then re-checks the condition; the waker changes the value (seq_cst) and then checks for
//   sleepers, locking the mutex before it notifies. Either the waker sees the sleeper, or the
//   sleeper sees the new value.
//
// Bounds: a host-supplied thread count is capped (max_threads(): 4 per hardware thread, never
// more than 1024), because an unbounded count can exhaust the machine's process table. When the
// system refuses a thread part-way, the workers already started are stopped and joined and the
// constructor throws Error(resource_exhausted): it neither hangs nor leaves threads behind.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xserv {

class ThreadPool {
 public:
  using Fn = std::function<void(std::size_t, std::size_t)>;

  struct Options {
    // How long an idle worker (and a caller waiting for the last chunks) polls before it sleeps.
    std::uint32_t spin_us = 20;
    // A loop is cut into at most this many chunks per thread (1: one contiguous range each).
    std::uint32_t chunks_per_thread = 4;
  };

  // threads == 0 means one per hardware thread. Throws Error(invalid_argument) when threads >
  // max_threads(), Error(resource_exhausted) when the system cannot start them.
  explicit ThreadPool(std::size_t threads = 0) : ThreadPool(threads, Options{}) {}
  ThreadPool(std::size_t threads, Options options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const noexcept { return workers_.size() + 1; }

  // How long idle threads poll from now on (Options::spin_us at construction), polls already
  // under way included: the CPU backend polls long while a forward runs (its loops come back to
  // back) and briefly once the step's sample is done (a host's cores are not burnt between steps).
  void set_spin_us(std::uint32_t us) noexcept { spin_us_.store(us, std::memory_order_relaxed); }
  std::uint32_t spin_us() const noexcept { return spin_us_.load(std::memory_order_relaxed); }

  // The most threads a pool may have here: 4 x std::thread::hardware_concurrency(), at most
  // kAbsoluteMaxThreads (and at least 4 when the hardware count is unknown).
  static constexpr std::size_t kAbsoluteMaxThreads = 1024;
  static std::size_t max_threads() noexcept;

  // fn(begin, end) over chunks of [0, n); each chunk has at least `grain` items where possible.
  // An exception thrown by fn is rethrown here after all chunks finished.
  void parallel_for(std::size_t n, const Fn& fn, std::size_t grain = 1);

 private:
  void worker_loop();
  void stop_workers() noexcept;
  // Claims and runs chunks of the current loop until none is left to claim.
  void run_chunks() noexcept;
  void run_chunk(std::uint64_t state) noexcept;
  bool claimable() const noexcept;
  void wait_for_work() noexcept;
  void wait_for_done() noexcept;

  std::vector<std::thread> workers_;
  Options options_;
  std::atomic<std::uint32_t> spin_us_;
  std::mutex loop_mutex_;  // serialises parallel_for calls
  // The current loop's function and size: written by its caller before it publishes the loop
  // in state_, read by a thread only after it claimed a chunk of that loop (see above).
  const Fn* fn_ = nullptr;
  std::size_t n_ = 0;
  std::exception_ptr error_;  // guarded by error_mutex_ while the loop runs
  std::mutex error_mutex_;
  std::uint64_t last_generation_ = 0;  // the caller's (under loop_mutex_)
  alignas(64) std::atomic<std::uint64_t> state_{0};      // generation | chunks | next
  alignas(64) std::atomic<std::uint32_t> remaining_{0};  // unfinished chunks of the loop
  alignas(64) std::atomic<bool> stop_{false};
  // The sleep path.
  std::mutex sleep_mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::atomic<std::uint32_t> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
};

}  // namespace xserv
