#include "parallel/rank_workers.hpp"

#include <system_error>
#include <utility>

#include "core/error.hpp"

namespace xserv {

RankWorkers::RankWorkers(int size) : size_(size) {
  XSERV_CHECK(size >= 1 && size <= 1024, ErrorCode::invalid_argument,
              "tensor-parallel size {} (expected 1 ..= 1024)", size);
  try {
    for (int r = 1; r < size; ++r) threads_.emplace_back([this, r] { worker(r); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& t : threads_) t.join();
    throw_error(ErrorCode::resource_exhausted, "tensor parallel: no thread for a rank ({})",
                e.what());
  }
}

RankWorkers::~RankWorkers() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankWorkers::worker(int rank) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* fn = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
    }
    std::exception_ptr error;
    try {
      (*fn)(rank);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    if (error) {
      if (on_error_) on_error_();
      // Hand the exception over (or drop it) under the lock: once pending_ reaches 0 the caller
      // owns and frees it, and this thread must not touch it any more.
      if (!first_error_) first_error_ = std::move(error);
      error = nullptr;
    }
    if (--pending_ == 0) done_.notify_all();
  }
}

void RankWorkers::run(const std::function<void(int)>& fn, const std::function<void()>& on_error) {
  {
    std::lock_guard lock(mutex_);
    fn_ = &fn;
    on_error_ = on_error;
    first_error_ = nullptr;
    pending_ = size_ - 1;
    ++generation_;
  }
  start_.notify_all();
  try {
    fn(0);
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (!first_error_) first_error_ = std::current_exception();
    if (on_error) on_error();
  }
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
  on_error_ = nullptr;
  if (first_error_) std::rethrow_exception(std::exchange(first_error_, nullptr));
}

}  // namespace xserv
