// libFuzzer target: the chat template (Qwen3's, and GPT-2's plain join) on arbitrary messages.
// Input: a flag byte, then messages separated by 0x00, each "role 0x01 content". Messages with
// invalid UTF-8 are dropped first (the C API refuses them before the template runs). The
// template must render valid UTF-8 or throw Error(invalid_argument) (a role it rejects).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xserv::fuzz::load_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool add_generation_prompt = (data[0] & 1) != 0;
  const bool enable_thinking = (data[0] & 2) != 0;
  const bool qwen = (data[0] & 4) != 0;
  const xserv::Tokenizer* tok = qwen ? xserv::fuzz::qwen3_tokenizer() : &xserv::fuzz::gpt2_tokenizer();
  if (tok == nullptr) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<xserv::Tokenizer::Message> msgs;
  while (!rest.empty() && msgs.size() < 64) {
    const std::size_t end = rest.find('\0');
    std::string_view item = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view{} : rest.substr(end + 1);
    const std::size_t sep = item.find('\1');
    xserv::Tokenizer::Message m;
    m.role = std::string(item.substr(0, sep));
    if (sep != std::string_view::npos) m.content = std::string(item.substr(sep + 1));
    if (xserv::utf8::find_invalid(m.role) != std::string_view::npos ||
        xserv::utf8::find_invalid(m.content) != std::string_view::npos)
      continue;
    msgs.push_back(std::move(m));
  }
  try {
    const std::string prompt = tok->apply_chat_template(msgs, add_generation_prompt, enable_thinking);
    if (xserv::utf8::find_invalid(prompt) != std::string::npos) __builtin_trap();
  } catch (const xserv::Error& e) {
    if (e.code() != xserv::ErrorCode::invalid_argument) __builtin_trap();
  }
  return 0;
}
