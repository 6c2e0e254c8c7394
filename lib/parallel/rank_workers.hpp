// RankWorkers: runs one function on every rank of a tensor-parallel group at once.
//
// Rank 0 runs on the calling thread, ranks 1 .. size-1 each on a thread of their own that lives
// as long as this object (a thread per rank, not one thread for all: the host communicator
// blocks a rank until its peers arrive, and NCCL driven from one thread would need every
// collective of every rank wrapped in one ncclGroupStart/End, i.e. the ranks' forwards
// interleaved op by op). run() returns when every rank has returned; when one or more threw,
// the first failure in time (the cause; its peers typically fail after it, woken by the abort)
// is rethrown, `on_error` having run at each failure (e.g. to abort the communicators a
// surviving rank may be blocked in).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xserv {

class RankWorkers {
 public:
  // Throws Error(invalid_argument) when size < 1, Error(resource_exhausted) when the system
  // refuses a thread.
  explicit RankWorkers(int size);
  ~RankWorkers();
  RankWorkers(const RankWorkers&) = delete;
  RankWorkers& operator=(const RankWorkers&) = delete;

  int size() const noexcept { return size_; }

  // fn(rank) on every rank concurrently; see the file comment. Not reentrant.
  void run(const std::function<void(int)>& fn, const std::function<void()>& on_error = {});

 private:
  void worker(int rank);

  int size_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  std::function<void()> on_error_;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr first_error_;
};

}  // namespace xserv
