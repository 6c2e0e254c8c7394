// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops).
//
// parallel_for splits [0, n) into contiguous chunks and returns when every chunk is done; the
// calling thread takes part. Calls are serialised: one loop runs at a time, which is what a
// forward pass needs (ops run one after another, each using all cores).
//
// Hand-off, designed for both an idle machine and a crowded one (a game, a shared build box):
// - A decode step of a small model is dozens of loops of a few microseconds each, so waking
//   sleeping workers through the kernel per loop costs more than the work. Idle workers poll an
//   atomic generation counter for spin_us after their last chunk (a pause per probe) and only
//   then sleep on a condition variable. Never sched_yield (nor std::atomic::wait, whose
//   libstdc++ spin yields): on a crowded machine a yield hands the core to another process for
//   a whole time slice, and the scheduler favours threads that sleep over ones that spin or
//   yield; and the polls are short (10 us: the gaps between a decode step's loops), because a
//   thread that polls long is charged like a busy one. Medians of 4-5 runs on the 2-core dev
//   machine at load 11 (embedded model, 2 threads, run-to-run noise about 40%): decode 400-540
//   tok/s with 50 us polls then atomic::wait, 930-980 with the old condition-variable pool,
//   930 with this one.
// - Chunks are claimed, not assigned: up to 4 per thread, taken in order from an atomic counter
//   by whichever thread is running. A worker the OS has descheduled simply claims nothing, and
//   the caller (or another worker) runs its share instead of waiting for it, so a loop waits
//   only for chunks that are already being run. Chunks stay contiguous ranges, and consecutive
//   chunks usually go to the same thread, so each thread still streams its slice of a weight.
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

  // threads == 0 means one per hardware thread. spin_us: how long an idle worker (and a caller
  // waiting for the last chunks) polls before it sleeps. Throws Error(invalid_argument) when
  // threads > max_threads(), Error(resource_exhausted) when the system cannot start them.
  explicit ThreadPool(std::size_t threads = 0, std::uint32_t spin_us = 10);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  std::size_t size() const noexcept { return workers_.size() + 1; }

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
  // Claims and runs chunks of loop `generation` until none is left (or a newer loop started).
  void run_chunks(std::uint32_t generation) noexcept;
  // Returns once a != old: polls for spin_us, then sleeps on cv until wake() is called.
  void wait_while_equal(const std::atomic<std::uint32_t>& a, std::uint32_t old,
                        std::condition_variable& cv);
  // Wakes the sleepers on cv after the value they wait on changed (cheap when none sleeps).
  void wake(std::condition_variable& cv, bool all);

  std::vector<std::thread> workers_;
  std::uint32_t spin_us_;
  std::mutex loop_mutex_;  // serialises parallel_for calls
  // The current loop. Written by the caller before it publishes the loop in state_ (release);
  // a worker reads them after loading state_ (acquire) and trusts them only when its claim of a
  // chunk of that same loop succeeds (the loop cannot finish, and be replaced, before then).
  std::atomic<const Fn*> fn_{nullptr};
  std::atomic<std::size_t> n_{0};
  std::atomic<std::uint32_t> chunks_{0};
  alignas(64) std::atomic<std::uint64_t> state_{0};  // generation << 32 | next chunk to claim
  alignas(64) std::atomic<std::uint32_t> done_{0};   // chunks of the current loop finished
  alignas(64) std::atomic<std::uint32_t> generation_{0};  // what idle workers wait on
  std::uint32_t last_generation_ = 0;
  std::atomic<bool> stop_{false};
  // Sleeping: sleepers_ counts threads inside wait_while_equal's sleep; both it and the waited
  // values are seq_cst, so a waker either sees a sleeper or the sleeper sees the new value.
  std::mutex sleep_mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::atomic<std::uint32_t> sleepers_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace xserv
