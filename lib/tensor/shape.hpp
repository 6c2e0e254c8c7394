// Shape: up to 4 dimensions, which is all a transformer forward needs ([T, H, D] at most plus
// the KV pool's [blocks, block_size, heads, head_dim]).
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.hpp"

namespace xserv {

class Shape {
 public:
  static constexpr std::size_t max_rank = 4;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) {
    XSERV_CHECK(dims.size() <= max_rank, ErrorCode::invalid_argument, "shape rank {} > {}",
                dims.size(), max_rank);
    for (auto d : dims) push_back(d);
  }

  void push_back(std::int64_t d) {
    XSERV_CHECK(rank_ < max_rank, ErrorCode::invalid_argument, "shape rank > {}", max_rank);
    XSERV_CHECK(d >= 0, ErrorCode::invalid_argument, "negative dimension {}", d);
    dims_[rank_++] = d;
  }

  std::size_t rank() const noexcept { return rank_; }
  std::int64_t operator[](std::size_t i) const noexcept { return dims_[i]; }
  std::int64_t& operator[](std::size_t i) noexcept { return dims_[i]; }
  std::int64_t back() const noexcept { return rank_ ? dims_[rank_ - 1] : 1; }

  std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }

  friend bool operator==(const Shape& a, const Shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (std::size_t i = 0; i < a.rank_; ++i)
      if (a.dims_[i] != b.dims_[i]) return false;
    return true;
  }

  std::string str() const {
    std::string s = "[";
    for (std::size_t i = 0; i < rank_; ++i) s += fmt::format("{}{}", i ? ", " : "", dims_[i]);
    return s + "]";
  }

 private:
  std::array<std::int64_t, max_rank> dims_{};
  std::size_t rank_ = 0;
};

}  // namespace xserv

template <>
struct fmt::formatter<xserv::Shape> : fmt::formatter<std::string> {
  auto format(const xserv::Shape& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
