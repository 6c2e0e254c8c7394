// Device, Buffer (owning) and Tensor (non-owning view).
//
// A Buffer owns bytes on one device through an Allocator; backends provide allocators (the CPU
// one here, the CUDA backend its arena carver). A Tensor is a pointer + dtype + shape into
// memory owned elsewhere (a Buffer, an mmap'd safetensors file, a backend arena). Tensors are
// contiguous row-major; ops that take strided input say so in their signature.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/dtype.hpp"
#include "tensor/shape.hpp"

namespace xserv {

enum class DeviceKind : std::uint8_t { cpu, cuda };
std::string_view device_name(DeviceKind d) noexcept;

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const noexcept = 0;
  // Throws Error(out_of_memory) with the size asked for when it cannot allocate.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
};

// 64-byte aligned host memory.
Allocator& cpu_allocator() noexcept;

class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& alloc, std::size_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  Device device() const noexcept;
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  Allocator* alloc_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Device device;

  Tensor() = default;
  Tensor(void* d, DType t, Shape s, Device dev = {}) : data(d), dtype(t), shape(s), device(dev) {}

  std::int64_t numel() const noexcept { return shape.numel(); }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  bool empty() const noexcept { return data == nullptr; }
  template <typename T>
  T* as() const noexcept { return static_cast<T*>(data); }

  // Rows [begin, begin + count) of a tensor viewed as [rows, ...] (contiguous).
  Tensor rows(std::int64_t begin, std::int64_t count) const;
  // Same memory, another shape with the same element count.
  Tensor reshape(Shape s) const;
};

}  // namespace xserv
