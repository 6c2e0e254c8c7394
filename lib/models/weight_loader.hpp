// WeightLoader: makes a model's weights resident on a backend, each checked against the shape
// the architecture expects.
//
// An architecture first declares every tensor it needs (name, alternative names, expected shape,
// how to fill it for dummy weights); load() then checks them all — a missing tensor or a wrong
// shape is Error(format) naming the tensor, the directory and both shapes — and imports each one
// with backend.import_weight() (zero copy on the CPU). With dummy weights nothing is read: every
// tensor is allocated on the backend in the config's dtype and filled with seeded random values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "io/safetensors.hpp"

namespace xserv {

// How a dummy weight is filled: small random values (GEMM weights, embeddings), ones plus a
// little noise (norm scales), or small values around zero (biases).
enum class DummyInit : std::uint8_t { normal, ones, bias };

class WeightLoader {
 public:
  // checkpoint == nullptr means dummy weights of `dummy_dtype` seeded with `seed`.
  WeightLoader(Backend& backend, const Checkpoint* checkpoint, DType dummy_dtype,
               std::uint64_t seed);

  // Declares a required tensor; the first of `names` present in the checkpoint is used. `dst`
  // must stay valid until load().
  void require(Tensor* dst, std::vector<std::string> names, Shape shape,
               DummyInit init = DummyInit::normal);
  // Declares a tensor used only when the checkpoint has it (never made for dummy weights).
  void optional(Tensor* dst, std::vector<std::string> names, Shape shape);
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
    const TensorInfo* info = nullptr;  // resolved by load()
  };
  void fill_dummy(Entry& e, std::size_t index);

  Backend& backend_;
  const Checkpoint* checkpoint_;
  DType dummy_dtype_;
  std::uint64_t seed_;
  std::vector<Entry> entries_;
  std::vector<Buffer> owned_;
};

}  // namespace xserv
