#include "cuda/device_arena.hpp"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.hpp"

namespace xserv::cuda {

namespace {
constexpr std::size_t piece_alignment = 256;
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Makes `device` current for its lifetime and restores the previous one: an arena may be used
// from a thread whose current GPU is another (tensor parallelism: one thread sets up every
// rank's memory), and cudaMalloc/cudaFree act on the current device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) noexcept {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      if (cudaSetDevice(device) == cudaSuccess) switched_ = true;
      // A device that does not exist (an arena of a backend whose constructor refused it):
      // clear the error, or the next launch check anywhere in the process would report it.
      else (void)cudaGetLastError();
    }
  }
  ~DeviceScope() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

void* device_malloc(int device, std::size_t bytes) {
  const DeviceScope scope(device);
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    std::size_t free_bytes = 0, total = 0;
    (void)cudaMemGetInfo(&free_bytes, &total);
    throw_error(ErrorCode::out_of_memory,
                "out of device memory: cudaMalloc of {} bytes failed ({} of {} bytes free)", bytes,
                free_bytes, total);
  }
  XSERV_CUDA_CHECK(status);
  return p;
}
}  // namespace

DeviceArena::DeviceArena(int device_index, std::size_t chunk_bytes)
    : device_index_(device_index), chunk_bytes_(chunk_bytes) {}

DeviceArena::~DeviceArena() {
  if (chunks_.empty() && dedicated_.empty()) return;  // nothing was allocated on the device
  const DeviceScope scope(device_index_);
  for (auto& c : chunks_) (void)cudaFree(c.base);
  for (auto& [p, bytes] : dedicated_) (void)cudaFree(p);
}

DeviceArena::Chunk& DeviceArena::new_chunk(std::size_t bytes) {
  Chunk c;
  c.size = bytes;
  c.base = static_cast<char*>(device_malloc(device_index_, bytes));
  reserved_ += bytes;
  chunks_.push_back(c);
  return chunks_.back();
}

void* DeviceArena::allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard lock(mutex_);
  const std::size_t size = round_up(bytes, piece_alignment);
  if (size > chunk_bytes_ / 2) {
    void* p = device_malloc(device_index_, size);
    dedicated_.emplace(p, size);
    reserved_ += size;
    return p;
  }
  // The chunk of the previous piece first, so that pieces allocated one after another lie back to
  // back while they fit (a model's q|k|v and gate|up weights then run as one stacked GEMV); then
  // the first chunk with room. First-fit alone put the next layer's q into an older chunk's gap
  // and its k elsewhere: 15 of Qwen3-8B's 36 layers lost their stacked q|k|v that way.
  auto fits = [&](std::size_t i) { return i < chunks_.size() && chunks_[i].size - chunks_[i].used >= size; };
  std::size_t index = chunks_.size();
  if (fits(last_chunk_)) {
    index = last_chunk_;
  } else {
    for (std::size_t i = 0; i < chunks_.size(); ++i) {
      if (fits(i)) {
        index = i;
        break;
      }
    }
  }
  if (index == chunks_.size()) new_chunk(chunk_bytes_);
  last_chunk_ = index;
  Chunk& c = chunks_[index];
  void* p = c.base + c.used;
  c.used += size;
  ++c.live;
  piece_chunk_.emplace(p, index);
  return p;
}

void DeviceArena::reserve_adjacent(const std::size_t* sizes, std::size_t count) {
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t size = round_up(sizes[i], piece_alignment);
    if (size > chunk_bytes_ / 2) return;  // dedicated: never adjacent to its neighbours
    total += size;
  }
  if (total == 0 || total > chunk_bytes_) return;
  std::lock_guard lock(mutex_);
  auto fits = [&](std::size_t i) { return i < chunks_.size() && chunks_[i].size - chunks_[i].used >= total; };
  if (fits(last_chunk_)) return;
  std::size_t index = chunks_.size();
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    if (fits(i)) {
      index = i;
      break;
    }
  }
  if (index == chunks_.size()) new_chunk(chunk_bytes_);
  last_chunk_ = index;  // allocate() carves from here first while the pieces fit
}

void DeviceArena::deallocate(void* p, std::size_t) noexcept {
  if (p == nullptr) return;
  std::lock_guard lock(mutex_);
  if (auto it = dedicated_.find(p); it != dedicated_.end()) {
    reserved_ -= it->second;
    const DeviceScope scope(device_index_);
    (void)cudaFree(p);  // synchronizes the device: frees happen at teardown, not in a step
    dedicated_.erase(it);
    return;
  }
  auto it = piece_chunk_.find(p);
  if (it == piece_chunk_.end()) return;
  Chunk& c = chunks_[it->second];
  piece_chunk_.erase(it);
  if (--c.live == 0) c.used = 0;  // every piece is back: the chunk can be carved again
}

}  // namespace xserv::cuda
