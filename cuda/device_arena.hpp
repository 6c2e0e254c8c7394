// Device memory for the CUDA backend: a few large cudaMallocs carved into pieces.
//
// Two policies share one class:
// - bump (weights): pieces are carved front to back from chunks of chunk_bytes and freed only
//   with the arena, because weights live as long as the backend;
// - recycling (allocator(): KV pools, activations, scratch): small pieces are carved from
//   chunks, and a chunk is reset once every piece in it was returned; a piece larger than half a
//   chunk (a KV pool) gets a cudaMalloc of its own.
// Never managed memory: a large managed allocation can hang the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensor/buffer.hpp"

namespace xserv::cuda {

class DeviceArena final : public Allocator {
 public:
  DeviceArena(int device_index, std::size_t chunk_bytes);
  ~DeviceArena() override;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  Device device() const noexcept override { return {DeviceKind::cuda, device_index_}; }
  // 256-byte aligned (what cuBLASLt's fastest kernels and 16-byte vector loads want).
  void* allocate(std::size_t bytes) override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  // The next pieces, of these sizes and allocated in this order, are to lie back to back (a
  // model's q|k|v or gate|up weights, which then run as one stacked GEMV): moves the carving
  // point to a chunk with room for all of them (the current one when it has it, else the first
  // that has, else a new one). A no-op when they could not share a chunk anyway (a piece over
  // half a chunk gets its own cudaMalloc). Without it a pair could straddle a chunk's end: the
  // first piece fills the chunk's tail, the second starts the next chunk.
  void reserve_adjacent(const std::size_t* sizes, std::size_t count);

  std::size_t reserved_bytes() const noexcept { return reserved_; }

 private:
  struct Chunk {
    char* base = nullptr;
    std::size_t size = 0;
    std::size_t used = 0;
    std::size_t live = 0;  // pieces handed out and not yet returned
  };
  Chunk& new_chunk(std::size_t bytes);

  int device_index_;
  std::size_t chunk_bytes_;
  std::size_t reserved_ = 0;
  std::mutex mutex_;
  std::vector<Chunk> chunks_;
  std::size_t last_chunk_ = 0;  // the chunk the previous piece came from
  std::unordered_map<void*, std::size_t> piece_chunk_;  // piece -> index in chunks_
  std::unordered_map<void*, std::size_t> dedicated_;    // own cudaMalloc -> bytes
};

}  // namespace xserv::cuda
