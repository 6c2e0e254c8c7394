// The in-process communicator for host tensors (see communicator.hpp).
//
// all_reduce_sum is two barriers: every rank posts its tensor, waits for the others, then sums
// one 1/size share of the elements over all ranks' tensors and writes the total back into every
// rank's tensor (each element is read and written by its share's owner only, so there is no
// race), and waits again so that no rank reads its tensor before every share is written.
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "core/error.hpp"
#include "parallel/communicator.hpp"

namespace xserv {

namespace {

// What the ranks of one group share.
class HostGroup {
 public:
  explicit HostGroup(int size) : size_(size), posted_(static_cast<std::size_t>(size)) {}

  int size() const noexcept { return size_; }

  // Returns when all ranks arrived (or throws once the group is aborted).
  void barrier() {
    std::unique_lock lock(mutex_);
    check_aborted();
    const std::uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    check_aborted();
  }

  void abort() noexcept {
    std::lock_guard lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

  void reset() noexcept {
    std::lock_guard lock(mutex_);
    aborted_ = false;
    arrived_ = 0;
  }

  void all_reduce_sum(int rank, Tensor t) {
    XSERV_CHECK(t.device.kind == DeviceKind::cpu, ErrorCode::invalid_argument,
                "all_reduce_sum: the host communicator sums host tensors only");
    XSERV_CHECK(is_float(t.dtype), ErrorCode::invalid_argument,
                "all_reduce_sum: dtype {} (expected f32, f16 or bf16)", dtype_name(t.dtype));
    posted_[static_cast<std::size_t>(rank)] = t;
    barrier();
    for (const Tensor& p : posted_)
      XSERV_CHECK(p.numel() == t.numel() && p.dtype == t.dtype, ErrorCode::invalid_argument,
                  "all_reduce_sum: ranks passed {} ({}) and {} ({}) elements", p.numel(),
                  dtype_name(p.dtype), t.numel(), dtype_name(t.dtype));
    const auto n = static_cast<std::size_t>(t.numel());
    const auto share = (n + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_);
    const std::size_t begin = std::min(n, share * static_cast<std::size_t>(rank));
    const std::size_t end = std::min(n, begin + share);
    if (begin < end) sum_share(begin, end - begin, t.dtype);
    barrier();
  }

 private:
  void check_aborted() const {
    XSERV_CHECK(!aborted_, ErrorCode::cancelled,
                "all_reduce_sum: another rank failed; the group is aborted");
  }

  // Elements [begin, begin + count) of every posted tensor = their sum in rank order.
  void sum_share(std::size_t begin, std::size_t count, DType dtype) {
    const std::size_t elem = dtype_size(dtype);
    std::vector<float> total(count, 0.0f), part(count);
    for (const Tensor& p : posted_) {
      const auto* src = static_cast<const std::uint8_t*>(p.data) + begin * elem;
      convert_to_f32(src, dtype, part.data(), count);
      for (std::size_t i = 0; i < count; ++i) total[i] += part[i];
    }
    for (const Tensor& p : posted_)
      convert_from_f32(total.data(), static_cast<std::uint8_t*>(p.data) + begin * elem, dtype,
                       count);
  }

  const int size_;
  std::vector<Tensor> posted_;  // rank r writes entry r before the first barrier only
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  bool aborted_ = false;
};

class HostCommunicator final : public Communicator {
 public:
  HostCommunicator(std::shared_ptr<HostGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->size(); }
  void all_reduce_sum(Tensor t) override {
    if (group_->size() > 1) group_->all_reduce_sum(rank_, t);
  }
  void abort() noexcept override { group_->abort(); }
  void reset() noexcept override { group_->reset(); }

 private:
  std::shared_ptr<HostGroup> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_host_communicators(int size) {
  XSERV_CHECK(size >= 1 && size <= 1024, ErrorCode::invalid_argument,
              "tensor-parallel size {} (expected 1 ..= 1024)", size);
  auto group = std::make_shared<HostGroup>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<HostCommunicator>(group, r));
  return comms;
}

}  // namespace xserv
