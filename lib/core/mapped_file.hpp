// A read-only memory map of a whole file. Weights are read straight from the map (zero-copy on
// the CPU backend, the source of the pinned-staging upload on CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace xserv {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws Error(not_found) when the file does not exist, Error(io) when it cannot be mapped.
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

// Reads a whole (small) file into a string. Throws like MappedFile.
std::string read_file(const std::string& path);

}  // namespace xserv
