#include "models/weight_loader.hpp"

#include <cmath>

#include "core/error.hpp"

namespace xserv {

WeightLoader::WeightLoader(Backend& backend, const Checkpoint* checkpoint, DType dummy_dtype,
                           std::uint64_t seed)
    : backend_(backend), checkpoint_(checkpoint), dummy_dtype_(dummy_dtype), seed_(seed) {}

void WeightLoader::require(Tensor* dst, std::vector<std::string> names, Shape shape,
                           DummyInit init) {
  entries_.push_back(Entry{dst, std::move(names), shape, init, true});
}

void WeightLoader::optional(Tensor* dst, std::vector<std::string> names, Shape shape) {
  entries_.push_back(Entry{dst, std::move(names), shape, DummyInit::bias, false});
}

bool WeightLoader::has(const std::string& name) const noexcept {
  return checkpoint_ && checkpoint_->find(name) != nullptr;
}

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) s += (i ? "' or '" : "") + names[i];
  return s;
}

// splitmix64: cheap, seedable and identical everywhere, so dummy models are reproducible.
std::uint64_t mix(std::uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::size_t WeightLoader::load(const std::function<void(std::size_t, std::size_t)>& on_progress) {
  std::size_t total = 0;
  if (checkpoint_) {
    for (auto& e : entries_) {
      for (const auto& n : e.names)
        if ((e.info = checkpoint_->find(n)) != nullptr) break;
      if (!e.info) {
        XSERV_CHECK(!e.required, ErrorCode::format, "{}: tensor '{}' of shape {} is missing",
                    checkpoint_->dir(), join_names(e.names), e.shape);
        continue;
      }
      XSERV_CHECK(e.info->shape == e.shape, ErrorCode::format,
                  "{}: tensor '{}' has shape {}, expected {}", checkpoint_->dir(), e.info->name,
                  e.info->shape, e.shape);
      XSERV_CHECK(is_float(e.info->dtype), ErrorCode::format,
                  "{}: tensor '{}' has dtype {}, expected a float type", checkpoint_->dir(),
                  e.info->name, dtype_name(e.info->dtype));
      total += e.info->bytes;
    }
  } else {
    for (const auto& e : entries_)
      if (e.required)
        total += static_cast<std::size_t>(e.shape.numel()) * dtype_size(dummy_dtype_);
  }

  std::size_t done = 0;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (checkpoint_) {
      if (!e.info) continue;
      Tensor host(const_cast<std::uint8_t*>(e.info->data), e.info->dtype, e.info->shape);
      *e.dst = backend_.import_weight(host);
      done += e.info->bytes;
    } else {
      if (!e.required) continue;
      fill_dummy(e, i);
      done += e.dst->bytes();
    }
    if (on_progress) on_progress(done, total);
  }
  return total;
}

void WeightLoader::fill_dummy(Entry& e, std::size_t index) {
  const auto n = static_cast<std::size_t>(e.shape.numel());
  // Uniform values of std 0.02 (GPT-2's init) keep activations of deep random models finite.
  const float scale = 0.02f * std::sqrt(3.0f);
  std::vector<float> values(n);
  std::uint64_t state = mix(seed_ ^ mix(index + 1));
  for (std::size_t i = 0; i < n; ++i) {
    state = mix(state);
    float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    switch (e.init) {
      case DummyInit::normal: values[i] = u * scale; break;
      case DummyInit::ones: values[i] = 1.0f + 0.1f * u; break;
      case DummyInit::bias: values[i] = 0.1f * u * scale; break;
    }
  }
  std::vector<std::uint8_t> bytes(n * dtype_size(dummy_dtype_));
  convert_from_f32(values.data(), bytes.data(), dummy_dtype_, n);
  Buffer& b = owned_.emplace_back(backend_.allocator(), bytes.size());
  *e.dst = Tensor(b.data(), dummy_dtype_, e.shape, backend_.device());
  backend_.upload(*e.dst, bytes.data());
}

}  // namespace xserv
