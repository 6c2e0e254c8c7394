// safetensors reading over mmap, zero copy, every header entry validated.
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data. Offsets are relative
// to the end of the header. A file is rejected (Error(format), naming the file and tensor) when
// the header is too long or cut, the JSON is broken, a dtype is unknown, shape x dtype size
// differs from the byte range, a range leaves the file or two ranges overlap. What a header can
// make xserv allocate is bounded by the header's own size (at most 100 MB, as HF's reader).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.hpp"
#include "tensor/buffer.hpp"

namespace xserv {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::size_t offset = 0;  // from the start of the file
  std::size_t bytes = 0;
  const std::uint8_t* data = nullptr;  // inside the mapping
};

class SafetensorsFile {
 public:
  // Throws Error(not_found | io | format).
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const noexcept { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  const TensorInfo* find(const std::string& name) const noexcept;
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  const MappedFile& mapping() const noexcept { return file_; }

 private:
  MappedFile file_;
  std::vector<TensorInfo> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

// All weights of a model directory: `model.safetensors`, or the shards named by
// `model.safetensors.index.json`, or (no index) every `*-0000N-of-0000M.safetensors` shard.
class Checkpoint {
 public:
  // Throws Error(not_found) when the directory has no safetensors or a shard (named by the
  // index, or one of 1..M of `*-0000N-of-0000M`) is missing, Error(io) for a file that is not a
  // regular file, Error(format) for a broken index or a tensor present in two shards.
  static Checkpoint open(const std::string& dir);

  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const noexcept;
  // A host view of a tensor; throws Error(not_found) naming the tensor and the directory.
  Tensor view(const std::string& name) const;
  std::vector<std::string> names() const;
  std::size_t total_bytes() const noexcept;
  // Drops the tensor's pages from memory (MappedFile::release_pages): for backends that copied it.
  void release(const TensorInfo& tensor) const noexcept;
  const std::string& dir() const noexcept { return dir_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

}  // namespace xserv
