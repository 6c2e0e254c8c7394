// libFuzzer target: a safetensors file of arbitrary bytes (header length, JSON header, data).
// SafetensorsFile::open must accept it or throw Error(format); an accepted file's tensors must
// lie inside the file, not overlap and match shape x dtype size.
#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xserv::fuzz::write_scratch(
      "model.safetensors", {reinterpret_cast<const char*>(data), size});
  xserv::fuzz::expect_ok_or_error([&] {
    const auto file = xserv::SafetensorsFile::open(path);
    for (const auto& t : file.tensors()) {
      // Invariants the loader promises its users (views read t.data[0 .. t.bytes)).
      if (t.offset > size || t.bytes > size - t.offset) __builtin_trap();
      if (static_cast<std::size_t>(t.shape.numel()) * xserv::dtype_size(t.dtype) != t.bytes)
        __builtin_trap();
      if (t.bytes > 0 && (t.data[0] != data[t.offset] || t.data[t.bytes - 1] != data[t.offset + t.bytes - 1]))
        __builtin_trap();
    }
  });
  return 0;
}
