// libFuzzer target: model.safetensors.index.json of arbitrary bytes beside one valid shard
// ("a.safetensors", two tensors). Checkpoint::open must open it or throw Error (format for a
// broken index, not_found for a shard it names that is not there); it must never read outside
// the directory (shard names with '/' or '..' are refused).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "io/safetensors.hpp"

namespace {
// Two f32 tensors "w" [2] and "b" [1]: 12 data bytes, header padded to 8.
std::string valid_shard() {
  std::string header =
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  while (header.size() % 8) header += ' ';
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return file + header + std::string(12, '\0');
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool ready = (xserv::fuzz::write_scratch("a.safetensors", valid_shard()), true);
  (void)ready;
  xserv::fuzz::write_scratch("model.safetensors.index.json",
                             {reinterpret_cast<const char*>(data), size});
  xserv::fuzz::expect_ok_or_error([&] {
    const auto ck = xserv::Checkpoint::open(xserv::fuzz::scratch_dir());
    for (const auto& name : ck.names())
      if (ck.find(name) == nullptr) __builtin_trap();
  });
  return 0;
}
