// A read-only memory map of a whole file. Weights are read straight from the map (zero-copy on
// the CPU backend, the source of the pinned-staging upload on CUDA).
//
// Only regular files are read. A FIFO, socket or device named as a model file would block the
// load forever (a FIFO's open waits for a writer) or stream without end (/dev/urandom), so every
// file is opened without blocking and checked with fstat before a byte is read; anything but a
// regular file is Error(io) naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace xserv {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws Error(not_found) when the file does not exist, Error(io) when it is not a regular
  // file or cannot be mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<const std::uint8_t> bytes() const noexcept { return {data_, size_}; }
  const std::string& path() const noexcept { return path_; }
  bool contains(const void* p) const noexcept {
    const auto* b = static_cast<const std::uint8_t*>(p);
    return data_ != nullptr && b >= data_ && b < data_ + size_;
  }

  // Drops the resident pages wholly inside [p, p + bytes) (clipped to the map): they count in
  // the process's RSS while mapped, and a backend that copied them to the device never reads
  // them again. Safe at any time: the map is read-only and file-backed, so a later read fetches
  // the page again.
  void release_pages(const void* p, std::size_t bytes) const noexcept;

 private:
  void reset() noexcept;
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// The default cap of read_file: far above any real config.json, generation_config.json or
// index, far below what would hurt a host.
inline constexpr std::size_t kMaxSmallFileBytes = std::size_t{16} << 20;
// The cap for tokenizer files (tokenizer.json of Qwen3 is 11 MB; the largest public ones ~35 MB).
inline constexpr std::size_t kMaxTokenizerFileBytes = std::size_t{128} << 20;

// Reads a whole (small) regular file into a string. Throws like MappedFile, and Error(format)
// when the file holds more than `max_bytes` (nothing past the cap is read).
std::string read_file(const std::string& path, std::size_t max_bytes = kMaxSmallFileBytes);

}  // namespace xserv
