// Chat templates without a Jinja engine: the template text shipped with a model is recognized by
// its content and its semantics are implemented here. Supported: ChatML (<|im_start|>role\n
// ...<|im_end|>\n), with Qwen3's rules for <think> blocks and enable_thinking when the template
// has them (Qwen3's tokenizer_config.json is the reference; the fixtures in
// tests/data/tokenizer/chat_qwen3.jsonl are transformers' renderings of it).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "tokenizer/added_vocabulary.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv::tokenizer {

struct ChatTemplate {
  enum class Kind { none, chatml };
  Kind kind = Kind::none;
  bool think_blocks = false;     // Qwen3: reasoning in assistant turns is re-rendered or dropped
  bool thinking_switch = false;  // Qwen3: enable_thinking=false appends an empty think block

  // Recognizes a template from its Jinja source (empty: no template).
  static ChatTemplate detect(std::string_view source);
};

// The prompt text. When `content` is given, it receives the byte ranges of the output that came
// from the messages' contents (not from the template), in order: the ranges where special-token
// text must stay text (Tokenizer::encode_chat).
std::string render_chat(const ChatTemplate& tmpl, std::span<const Tokenizer::Message> msgs,
                        bool add_generation_prompt, bool enable_thinking,
                        std::vector<AddedTokenMatcher::Range>* content = nullptr);

}  // namespace xserv::tokenizer
