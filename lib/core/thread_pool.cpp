#include "core/thread_pool.hpp"

#include <algorithm>
#include <system_error>

#include "core/error.hpp"

namespace xserv {

std::size_t ThreadPool::max_threads() noexcept {
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp<std::size_t>(4 * hw, 4, kAbsoluteMaxThreads);
}

ThreadPool::ThreadPool(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  XSERV_CHECK(threads <= max_threads(), ErrorCode::invalid_argument,
              "{} threads asked; at most {} here (4 per hardware thread, never more than {})",
              threads, max_threads(), kAbsoluteMaxThreads);
  workers_.reserve(threads - 1);
  for (std::size_t i = 1; i < threads; ++i) {
    try {
      workers_.emplace_back([this, i] { worker_loop(i); });
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
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void ThreadPool::run_chunk(std::size_t index) {
  if (index >= chunks_) return;
  std::size_t begin = n_ * index / chunks_;
  std::size_t end = n_ * (index + 1) / chunks_;
  try {
    if (begin < end) (*fn_)(begin, end);
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::worker_loop(std::size_t index) {
  std::size_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunk(index);
    {
      std::lock_guard lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::size_t n, const std::function<void(std::size_t, std::size_t)>& fn,
                              std::size_t grain) {
  if (n == 0) return;
  grain = std::max<std::size_t>(grain, 1);
  std::size_t chunks = std::min(size(), (n + grain - 1) / grain);
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard loop_lock(loop_mutex_);
  {
    std::lock_guard lock(mutex_);
    fn_ = &fn;
    n_ = n;
    chunks_ = chunks;
    pending_ = workers_.size();
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_chunk(0);
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace xserv
