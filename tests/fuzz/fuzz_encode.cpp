// libFuzzer target: encode arbitrary bytes with the real GPT-2 and Qwen3 tokenizers. Invalid
// UTF-8 must be Error(invalid_argument); valid text must give ids inside the vocabulary, and
// (GPT-2, byte-level BPE without normalization) decode back to exactly the input: a check
// against the tokenizer's own contract, not only "no crash".
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xserv::fuzz::load_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool allow_special = (data[0] & 1) != 0;
  const bool qwen = (data[0] & 2) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const xserv::Tokenizer* tok = qwen ? xserv::fuzz::qwen3_tokenizer() : &xserv::fuzz::gpt2_tokenizer();
  if (tok == nullptr) return 0;
  const bool valid = xserv::utf8::find_invalid(text) == std::string_view::npos;
  try {
    const auto ids = tok->encode(text, allow_special);
    if (!valid) __builtin_trap();  // accepted invalid UTF-8
    for (auto id : ids)
      if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
    if (!qwen && tok->decode(ids) != text) __builtin_trap();  // GPT-2 round trip is exact
  } catch (const xserv::Error& e) {
    if (valid && e.code() != xserv::ErrorCode::resource_exhausted) __builtin_trap();
  }
  return 0;
}
