// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops).
//
// parallel_for splits [0, n) into contiguous chunks, one per thread (the calling thread takes
// part), and returns when every chunk is done. Calls are serialised: one loop runs at a time,
// which is what a forward pass needs (ops run one after another, each using all cores).
//
// Bounds: a host-supplied thread count is capped (max_threads(): 4 per hardware thread, never
// more than 1024), because an unbounded count can exhaust the machine's process table. When the
// system refuses a thread part-way, the workers already started are stopped and joined and the
// constructor throws Error(resource_exhausted): it neither hangs nor leaves threads behind.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xserv {

class ThreadPool {
 public:
  // threads == 0 means one per hardware thread. Throws Error(invalid_argument) when threads >
  // max_threads(), Error(resource_exhausted) when the system cannot start them.
  explicit ThreadPool(std::size_t threads = 0);
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
  void parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn,
                    std::size_t grain = 1);

 private:
  void worker_loop(std::size_t index);
  void run_chunk(std::size_t index);
  void stop_workers() noexcept;

  std::vector<std::thread> workers_;
  std::mutex loop_mutex_;  // serialises parallel_for calls
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(std::size_t, std::size_t)>* fn_ = nullptr;
  std::size_t n_ = 0;
  std::size_t chunks_ = 0;
  std::size_t pending_ = 0;
  std::size_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace xserv
