// libFuzzer target: tokenizer.json of arbitrary bytes. Tokenizer::load must build a tokenizer
// or throw Error; a tokenizer it builds must encode and decode a fixed text without crashing
// (its patterns, vocabulary and merges came from the input).
#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xserv::fuzz::write_scratch(
      "tokenizer.json", {reinterpret_cast<const char*>(data), size});
  xserv::fuzz::expect_ok_or_error([&] {
    const xserv::Tokenizer tok = xserv::Tokenizer::load(path);
    const auto ids = tok.encode("Hello world! <|endoftext|> 123 caf\xc3\xa9\n\n  x");
    (void)tok.decode(ids);
    for (std::int32_t id = -1; id <= tok.vocab_size(); ++id) {
      (void)tok.token_bytes(id);
      (void)tok.is_special(id);
      if (id > 64) break;
    }
  });
  return 0;
}
