// libFuzzer target: config.json of arbitrary bytes. ModelConfig::parse must return a config
// whose sizes are all in 1 ..= 2^30 (what the loaders size things from) or throw Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.hpp"
#include "io/model_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  xserv::fuzz::expect_ok_or_error([&] {
    const xserv::ModelConfig c = xserv::ModelConfig::parse(text, "config.json");
    for (std::int32_t v : {c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
                           c.head_dim, c.intermediate_size, c.max_position_embeddings})
      if (v <= 0 || v > (1 << 30)) __builtin_trap();
    if (c.num_heads % c.num_kv_heads != 0) __builtin_trap();
    for (auto id : c.eos_token_ids)
      if (id < 0 || id >= c.vocab_size) __builtin_trap();
  });
  return 0;
}
