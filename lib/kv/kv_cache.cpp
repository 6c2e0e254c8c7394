#include "kv/kv_cache.hpp"

#include <limits>

#include "core/error.hpp"

namespace xserv::kv {

std::size_t KvSpec::bytes_per_block(std::int32_t block_size) const noexcept {
  return 2 * static_cast<std::size_t>(num_layers) * static_cast<std::size_t>(block_size) *
         static_cast<std::size_t>(num_kv_heads) * static_cast<std::size_t>(head_dim) *
         dtype_size(dtype);
}

namespace {

// The pool's block count from the options, after checking the spec and the options.
std::int32_t pool_blocks(const KvSpec& spec, const KvCacheOptions& o) {
  XSERV_CHECK(spec.num_layers > 0 && spec.num_kv_heads > 0 && spec.head_dim > 0,
              ErrorCode::invalid_argument, "KV cache: {} layers, {} kv heads, head_dim {}",
              spec.num_layers, spec.num_kv_heads, spec.head_dim);
  XSERV_CHECK(o.block_size > 0 && o.block_size <= 1024, ErrorCode::invalid_argument,
              "KV cache: block size {} (expected 1 ..= 1024)", o.block_size);
  XSERV_CHECK(o.num_blocks >= 0, ErrorCode::invalid_argument, "KV cache: {} blocks",
              o.num_blocks);
  XSERV_CHECK(o.num_blocks > 0 || o.memory_bytes > 0, ErrorCode::invalid_argument,
              "KV cache: give a block count or a memory budget");
  if (o.num_blocks > 0) return o.num_blocks;
  std::size_t per_block = spec.bytes_per_block(o.block_size);
  std::size_t n = o.memory_bytes / per_block;
  XSERV_CHECK(n > 0, ErrorCode::invalid_argument,
              "KV cache: a budget of {} bytes holds no block of {} bytes", o.memory_bytes, per_block);
  return static_cast<std::int32_t>(
      std::min<std::size_t>(n, static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())));
}

}  // namespace

KvCache::KvCache(Backend& backend, const KvSpec& spec, const KvCacheOptions& options)
    : spec_(spec),
      block_size_(options.block_size),
      blocks_(pool_blocks(spec, options), options.block_size, options.prefix_cache) {
  const std::int32_t n = blocks_.num_blocks();
  Shape pool_shape{n, block_size_, spec.num_kv_heads, spec.head_dim};
  std::size_t pool_bytes =
      static_cast<std::size_t>(pool_shape.numel()) * dtype_size(spec.dtype);
  Device dev = backend.device();
  layers_.reserve(static_cast<std::size_t>(spec.num_layers));
  views_.reserve(static_cast<std::size_t>(spec.num_layers));
  for (std::int32_t l = 0; l < spec.num_layers; ++l) {
    Buffer& b = layers_.emplace_back(backend.allocator(), 2 * pool_bytes);
    auto* base = static_cast<std::uint8_t*>(b.data());
    views_.push_back(KvLayer{Tensor(base, spec.dtype, pool_shape, dev),
                             Tensor(base + pool_bytes, spec.dtype, pool_shape, dev)});
  }
}

std::size_t KvCache::bytes() const noexcept {
  std::size_t total = 0;
  for (const auto& b : layers_) total += b.size();
  return total;
}

KvLayer KvCache::layer(std::int32_t index) const {
  XSERV_CHECK(index >= 0 && index < spec_.num_layers, ErrorCode::invalid_argument,
              "KV cache: layer {} of {}", index, spec_.num_layers);
  return views_[static_cast<std::size_t>(index)];
}

}  // namespace xserv::kv
