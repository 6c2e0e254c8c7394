#include "tensor/buffer.hpp"

#include <cstdlib>
#include <new>

#include "core/error.hpp"

namespace xserv {

std::string_view device_name(DeviceKind d) noexcept {
  return d == DeviceKind::cuda ? "cuda" : "cpu";
}

namespace {
class CpuAllocator final : public Allocator {
 public:
  Device device() const noexcept override { return {DeviceKind::cpu, 0}; }
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) return nullptr;
    std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw_error(ErrorCode::out_of_memory, "cannot allocate {} bytes of host memory", bytes);
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { std::free(p); }
};
}  // namespace

Allocator& cpu_allocator() noexcept {
  static CpuAllocator alloc;
  return alloc;
}

Buffer::Buffer(Allocator& alloc, std::size_t bytes)
    : alloc_(&alloc), data_(alloc.allocate(bytes)), bytes_(bytes) {}

Buffer::~Buffer() {
  if (data_ != nullptr) alloc_->deallocate(data_, bytes_);
}

Buffer::Buffer(Buffer&& o) noexcept : alloc_(o.alloc_), data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) alloc_->deallocate(data_, bytes_);
    alloc_ = o.alloc_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Device Buffer::device() const noexcept { return alloc_ ? alloc_->device() : Device{}; }

Tensor Tensor::rows(std::int64_t begin, std::int64_t count) const {
  XSERV_CHECK(shape.rank() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0],
              ErrorCode::invalid_argument, "rows [{}, {}) out of tensor of shape {}", begin,
              begin + count, shape);
  std::int64_t row = shape[0] ? numel() / shape[0] : 0;
  Shape s = shape;
  s[0] = count;
  auto* p = static_cast<char*>(data) + begin * row * static_cast<std::int64_t>(dtype_size(dtype));
  return Tensor(p, dtype, s, device);
}

Tensor Tensor::reshape(Shape s) const {
  XSERV_CHECK(s.numel() == numel(), ErrorCode::invalid_argument, "cannot reshape {} to {}", shape, s);
  return Tensor(data, dtype, s, device);
}

}  // namespace xserv
