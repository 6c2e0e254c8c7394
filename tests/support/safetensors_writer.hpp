// Builds safetensors files in tests (valid ones, and corrupt ones by editing the header text).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tensor/dtype.hpp"
#include "tensor/shape.hpp"

namespace xserv::test {

struct SafetensorsWriter {
  struct Entry {
    std::string name;
    std::string dtype;  // safetensors spelling: "F32", "BF16", ...
    std::vector<std::int64_t> shape;
    std::string bytes;
  };
  std::vector<Entry> entries;

  void add(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape,
           std::string bytes) {
    entries.push_back({name, dtype, std::move(shape), std::move(bytes)});
  }
  void add_f32(const std::string& name, std::vector<std::int64_t> shape, const std::vector<float>& v) {
    std::string b(v.size() * 4, '\0');
    std::memcpy(b.data(), v.data(), b.size());
    add(name, "F32", std::move(shape), std::move(b));
  }

  // The JSON header as a well-formed writer would produce it (padded to 8 bytes).
  std::string header() const {
    std::string h = "{";
    std::size_t offset = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const auto& e = entries[i];
      if (i) h += ",";
      h += fmt::format(R"("{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", e.name,
                       e.dtype, fmt::join(e.shape, ","), offset, offset + e.bytes.size());
      offset += e.bytes.size();
    }
    h += "}";
    while (h.size() % 8) h += ' ';
    return h;
  }

  std::string data() const {
    std::string d;
    for (const auto& e : entries) d += e.bytes;
    return d;
  }

  // A file from an explicit header text (to corrupt it) and data.
  static std::string file(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
  }
  std::string file() const { return file(header(), data()); }
};

}  // namespace xserv::test
