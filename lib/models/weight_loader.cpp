#include "models/weight_loader.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <system_error>
#include <thread>

#include "core/error.hpp"

namespace xserv {

WeightLoader::WeightLoader(Backend& backend, const Checkpoint* checkpoint, DType dummy_dtype,
                           std::uint64_t seed)
    : backend_(backend), checkpoint_(checkpoint), dummy_dtype_(dummy_dtype), seed_(seed) {}

Shape Slice::of(const Shape& full) const {
  if (whole()) return full;
  Shape s = full;
  std::int64_t n = 0;
  for (const auto& r : ranges) n += r.second;
  s[static_cast<std::size_t>(dim)] = n;
  return s;
}

void WeightLoader::require(Tensor* dst, std::vector<std::string> names, Shape shape,
                           DummyInit init, Slice slice) {
  entries_.push_back(Entry{dst, std::move(names), shape, init, true, std::move(slice)});
}

void WeightLoader::optional(Tensor* dst, std::vector<std::string> names, Shape shape,
                            Slice slice) {
  entries_.push_back(Entry{dst, std::move(names), shape, DummyInit::bias, false, std::move(slice)});
}

void WeightLoader::adjacent(std::initializer_list<const Tensor*> members) {
  const int group = groups_++;
  for (const Tensor* t : members)
    for (auto& e : entries_)
      if (e.dst == t) e.group = group;
}

std::size_t WeightLoader::import_bytes(const Entry& e) const {
  if (checkpoint_) {
    if (!e.info) return 0;
    // f16 becomes bf16 on a device that converts: the same size.
    return static_cast<std::size_t>(e.slice.of(e.info->shape).numel()) * dtype_size(e.info->dtype);
  }
  return e.required ? static_cast<std::size_t>(e.slice.of(e.shape).numel()) * dtype_size(dummy_dtype_) : 0;
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
      total += static_cast<std::size_t>(e.slice.of(e.shape).numel()) * dtype_size(e.info->dtype);
    }
  } else {
    for (const auto& e : entries_)
      if (e.required)
        total += static_cast<std::size_t>(e.slice.of(e.shape).numel()) * dtype_size(dummy_dtype_);
  }

  std::size_t done = 0;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.group >= 0 && (i == 0 || entries_[i - 1].group != e.group)) {
      // The first of a run of adjacent() entries: tell the backend their sizes.
      std::vector<std::size_t> sizes;
      for (std::size_t j = i; j < entries_.size() && entries_[j].group == e.group; ++j)
        if (const std::size_t b = import_bytes(entries_[j]); b > 0) sizes.push_back(b);
      if (sizes.size() > 1) backend_.reserve_adjacent_weights(sizes);
    }
    if (checkpoint_) {
      if (!e.info) continue;
      import_slice(e);
      done += e.dst->bytes();
    } else {
      if (!e.required) continue;
      fill_dummy(e, i);
      done += e.dst->bytes();
    }
    if (on_progress) on_progress(done, total);
  }
  return total;
}

void WeightLoader::import_slice(Entry& e) {
  const TensorInfo& info = *e.info;
  const std::size_t elem = dtype_size(info.dtype);
  const Shape shape = e.slice.of(info.shape);
  const auto* src = info.data;
  // Whole rows in one range are a view of the mapping, as is the whole tensor.
  if (e.slice.whole() || (e.slice.dim == 0 && e.slice.ranges.size() == 1)) {
    const std::int64_t row = info.shape[0] > 0 ? info.shape.numel() / info.shape[0] : 0;
    if (!e.slice.whole()) src += static_cast<std::size_t>(e.slice.ranges[0].first * row) * elem;
    Tensor host(const_cast<std::uint8_t*>(src), info.dtype, shape);
    *e.dst = backend_.import_weight(host);
    // A backend that copied the weight (CUDA) never reads the mapping again: drop its pages
    // now, so host memory peaks at one tensor, not at the whole checkpoint.
    if (e.dst->data != host.data) checkpoint_->release(info);
    return;
  }
  // Gather: per outer index (one for dim 0, each row for dim 1) the ranges, back to back.
  const bool by_rows = e.slice.dim == 0;
  const std::int64_t outer = by_rows ? 1 : info.shape[0];
  const std::int64_t unit = by_rows ? info.shape.numel() / info.shape[0] : 1;  // elements/index
  const std::int64_t stride = by_rows ? 0 : info.shape[1];                     // elements/outer
  std::vector<std::uint8_t> staging(static_cast<std::size_t>(shape.numel()) * elem);
  std::uint8_t* out = staging.data();
  for (std::int64_t o = 0; o < outer; ++o)
    for (const auto& [begin, count] : e.slice.ranges) {
      const auto n = static_cast<std::size_t>(count * unit) * elem;
      std::memcpy(out, src + static_cast<std::size_t>(o * stride + begin * unit) * elem, n);
      out += n;
    }
  Tensor host(staging.data(), info.dtype, shape);
  *e.dst = backend_.import_weight(host);
  if (e.dst->data == host.data) {  // a zero-copy backend: keep the gathered copy alive
    Buffer& b = owned_.emplace_back(backend_.allocator(), staging.size());
    *e.dst = Tensor(b.data(), info.dtype, shape, backend_.device());
    backend_.upload(*e.dst, staging.data());
    backend_.synchronize();
  }
  checkpoint_->release(info);
}

void WeightLoader::fill_dummy(Entry& e, std::size_t index) {
  e.shape = e.slice.of(e.shape);
  const auto n = static_cast<std::size_t>(e.shape.numel());
  const std::size_t elem = dtype_size(dummy_dtype_);
  // CPU memory is filled in place; other devices get a host staging copy (not zeroed first),
  // imported like a checkpoint's tensor: weights then lie in declaration order in the weight
  // memory, so stacked q|k|v and gate|up views form as they do for real checkpoints (and speed
  // measured on dummy weights is the speed of a real model).
  const bool host = backend_.device().kind == DeviceKind::cpu;
  Buffer* b = host ? &owned_.emplace_back(backend_.allocator(), n * elem) : nullptr;
  std::unique_ptr<std::uint8_t[]> staging(host ? nullptr : new std::uint8_t[n * elem]);
  std::uint8_t* out = host ? static_cast<std::uint8_t*>(b->data()) : staging.get();
  // Uniform values of std 0.02 (GPT-2's init) keep activations of deep random models finite.
  const float scale = 0.02f * std::sqrt(3.0f);
  const std::uint64_t key = mix(seed_ ^ mix(index + 1));
  const DummyInit init = e.init;
  const DType dtype = dummy_dtype_;
  // Each value hashes (key, i), so the result does not depend on how the range is split; the
  // split over threads matters for multi-GB models (Qwen3-8B has 8e9 values to make).
  auto fill = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint64_t h = mix(key + i * 0x9E3779B97F4A7C15ull);
      const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
      float v = init == DummyInit::ones ? 1.0f + 0.1f * u
                : init == DummyInit::bias ? 0.1f * u * scale
                                          : u * scale;
      convert_from_f32(&v, out + i * elem, dtype, 1);
    }
  };
  const std::size_t threads =
      n < (1u << 20) ? 1 : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 32);
  if (threads == 1) {
    fill(0, n);
  } else {
    std::vector<std::thread> pool;
    const std::size_t chunk = (n + threads - 1) / threads;
    std::size_t t = 0;
    try {
      for (; t < threads; ++t)
        pool.emplace_back(fill, std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
    } catch (const std::system_error&) {
      // The system refused a thread: this one fills the chunks that have none.
      for (; t < threads; ++t) fill(std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
    }
    for (auto& th : pool) th.join();
  }
  if (host) {
    *e.dst = Tensor(b->data(), dummy_dtype_, e.shape, backend_.device());
  } else {
    *e.dst = backend_.import_weight(Tensor(staging.get(), dummy_dtype_, e.shape));
    backend_.synchronize();  // `staging` is freed on return; a copy may still be reading it
  }
}

}  // namespace xserv
