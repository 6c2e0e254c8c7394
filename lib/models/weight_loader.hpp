// WeightLoader: makes a model's weights resident on a backend, each checked against the shape
// the architecture expects.
//
// An architecture first declares every tensor it needs (name, alternative names, expected shape,
// how to fill it for dummy weights); load() then checks them all — a missing tensor or a wrong
// shape is Error(format) naming the tensor, the directory and both shapes — and imports each one
// with backend.import_weight() (zero copy on the CPU). With dummy weights nothing is read: every
// tensor is allocated on the backend in the config's dtype and filled with seeded random values.
//
// Tensor parallelism: a declaration may carry a Slice, the part of the checkpoint tensor this
// rank holds (docs/parallel.md). The checkpoint's full shape is checked as always; only the
// slice is imported. A slice of whole rows is a view of the mapping (zero copy on the CPU);
// any other (columns, several ranges) is gathered into a host staging copy first, which the
// backend copies (CUDA) or which is kept in a buffer of its own (CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "io/safetensors.hpp"

namespace xserv {

// How a dummy weight is filled: small random values (GEMM weights, embeddings), ones plus a
// little noise (norm scales), or small values around zero (biases).
enum class DummyInit : std::uint8_t { normal, ones, bias };

// The part of a tensor one rank loads: the index ranges [begin, begin + count) of dimension
// `dim` (0, or 1 of a 2-D tensor), concatenated in order. No ranges: the whole tensor.
struct Slice {
  int dim = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;  // (begin, count)

  static Slice rows(std::int64_t begin, std::int64_t count) { return {0, {{begin, count}}}; }
  static Slice cols(std::int64_t begin, std::int64_t count) { return {1, {{begin, count}}}; }
  bool whole() const noexcept { return ranges.empty(); }
  // The shape of this slice of a tensor of shape `full`.
  Shape of(const Shape& full) const;
};

class WeightLoader {
 public:
  // checkpoint == nullptr means dummy weights of `dummy_dtype` seeded with `seed`.
  WeightLoader(Backend& backend, const Checkpoint* checkpoint, DType dummy_dtype,
               std::uint64_t seed);

  // Declares a required tensor; the first of `names` present in the checkpoint is used. `dst`
  // must stay valid until load().
  // `shape` is the checkpoint's (full) shape; `slice` the part loaded into *dst.
  void require(Tensor* dst, std::vector<std::string> names, Shape shape,
               DummyInit init = DummyInit::normal, Slice slice = {});
  // Declares a tensor used only when the checkpoint has it (never made for dummy weights).
  void optional(Tensor* dst, std::vector<std::string> names, Shape shape, Slice slice = {});
  // Declares that these tensors (already declared, one after another) are to lie back to back
  // on the device, in this order: the backend is told before the first is imported
  // (Backend::reserve_adjacent_weights), so a stacked view over them (Qwen3's q|k|v, gate|up)
  // never breaks at the end of a device-memory chunk.
  void adjacent(std::initializer_list<const Tensor*> members);
  // True when the checkpoint holds `name` (false for dummy weights).
  bool has(const std::string& name) const noexcept;

  // Checks every declared tensor first (so a broken checkpoint fails before any upload), then
  // imports them in order. Returns the bytes made resident.
  std::size_t load(const std::function<void(std::size_t, std::size_t)>& on_progress);

  // Buffers that hold dummy weights (the model keeps them alive).
  std::vector<Buffer> take_owned() { return std::move(owned_); }

 private:
  struct Entry {
    Tensor* dst;
    std::vector<std::string> names;
    Shape shape;
    DummyInit init;
    bool required;
    Slice slice;
    const TensorInfo* info = nullptr;  // resolved by load()
    int group = -1;                    // adjacent(): entries of one group share the number
  };
  void fill_dummy(Entry& e, std::size_t index);
  // The bytes entry e will occupy on the backend (0 when it is not imported).
  std::size_t import_bytes(const Entry& e) const;
  // Makes e's slice of the checkpoint tensor resident in *e.dst.
  void import_slice(Entry& e);

  Backend& backend_;
  const Checkpoint* checkpoint_;
  DType dummy_dtype_;
  std::uint64_t seed_;
  std::vector<Entry> entries_;
  std::vector<Buffer> owned_;
  int groups_ = 0;
};

}  // namespace xserv
