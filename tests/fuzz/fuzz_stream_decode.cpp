// libFuzzer target: streaming decode of arbitrary ids (in range, out of range, negative) with
// the real GPT-2 and Qwen3 tokenizers. StreamDecoder's contract: every push() returns whole
// UTF-8 characters only, and all pushes plus flush() concatenate to decode() of all the ids.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/utf8.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xserv::fuzz::load_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool skip_special = (data[0] & 1) != 0;
  const bool qwen = (data[0] & 2) != 0;
  ++data;
  --size;
  const xserv::Tokenizer* tok = qwen ? xserv::fuzz::qwen3_tokenizer() : &xserv::fuzz::gpt2_tokenizer();
  if (tok == nullptr) return 0;
  std::vector<std::int32_t> ids;
  while (size > 0 && ids.size() < 4096) {
    const std::uint32_t v = xserv::fuzz::take_u32(data, size);
    // Mostly ids of the vocabulary (all of it reachable), sometimes any int32.
    ids.push_back((v >> 31) ? static_cast<std::int32_t>(v)
                            : static_cast<std::int32_t>(v % static_cast<std::uint32_t>(tok->vocab_size() + 8)));
  }
  xserv::StreamDecoder stream(*tok, skip_special);
  std::string streamed;
  for (auto id : ids) {
    const std::string piece = stream.push(id);
    if (xserv::utf8::find_invalid(piece) != std::string::npos) __builtin_trap();
    streamed += piece;
  }
  streamed += stream.flush();
  if (streamed != tok->decode(ids, skip_special)) __builtin_trap();
  return 0;
}
