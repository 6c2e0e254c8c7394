// xserv::Tokenizer: text <-> token ids for byte-level BPE models (GPT-2 and Qwen2/Qwen3
// families), producing the same ids as Hugging Face `tokenizers` on every input.
//
// Encoding, in HF's order: added tokens (<|im_start|>, <|endoftext|>, ...) are cut out of the
// raw text first; each stretch between them is normalized (NFC for Qwen), split into pre-tokens
// by the model's pattern, and every pre-token is turned into ids by BPE merges in rank order.
// Encoding never adds BOS/EOS tokens (neither family's post-processor adds any).
//
// Thread-safety: a Tokenizer is immutable after load() apart from an internal, locked word
// cache; encode/decode may be called from any number of threads at once. Copies share the
// loaded tables (copying and moving are cheap).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xserv {

class Tokenizer {
 public:
  // `path`: a model directory (its tokenizer.json, else vocab.json + merges.txt) or the path of
  // a tokenizer.json. The chat template comes from tokenizer_config.json (or
  // chat_template.jinja) in the same directory when present.
  // Throws Error(not_found) when no tokenizer files are there, Error(io) for one that is not a
  // regular file (a FIFO, a device), Error(format) for malformed files or one larger than
  // kMaxTokenizerFileBytes (core/mapped_file.hpp), Error(unsupported) for tokenizer kinds other
  // than byte-level BPE.
  static Tokenizer load(const std::string& path);

  // Token ids of `text`. allow_special = false encodes special added tokens (those marked
  // "special", e.g. <|im_start|>) as ordinary text, so untrusted input cannot inject them
  // (HF: encode_special_tokens = true); non-special added tokens such as <think> still match.
  // Throws Error(invalid_argument) when `text` is not valid UTF-8 (nothing is guessed or
  // replaced: the message gives the byte offset), Error(resource_exhausted) when the
  // tokenizer's pre-tokenizer pattern backtracks past its match budget on this text.
  std::vector<std::int32_t> encode(std::string_view text, bool allow_special = true) const;

  // Text of `ids`. Ids outside the vocabulary (e.g. the padding rows of a model's embedding)
  // are skipped, as HF does; skip_special drops special added tokens. Bytes that do not form
  // valid UTF-8 (a character cut off by the end of `ids`) become U+FFFD, one per maximal
  // invalid subsequence, like HF's (Rust's) from_utf8_lossy.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;
  // The raw bytes of `ids`, without the U+FFFD repair.
  std::string decode_bytes(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // Number of ids, added tokens included (GPT-2: 50257, Qwen3: 151669).
  std::int32_t vocab_size() const;
  // Id of a token given in its vocabulary form (byte-level, e.g. "Ġthe") or an added token's
  // content ("<|im_end|>").
  std::optional<std::int32_t> token_id(std::string_view token) const;
  // The vocabulary string of `id` (byte-level form; added tokens as written); empty when `id`
  // is out of range.
  std::string_view token_text(std::int32_t id) const;
  // The raw bytes that `id` decodes to; empty when out of range.
  std::string_view token_bytes(std::int32_t id) const;
  bool is_special(std::int32_t id) const;

  // True when the model ships a chat template that xserv renders: ChatML (<|im_start|>), with
  // Qwen3's handling of <think> blocks and enable_thinking when the template has them.
  bool has_chat_template() const;

  struct Message {
    std::string role, content;
  };
  // The prompt for `msgs`, byte for byte what transformers' apply_chat_template(tokenize=False)
  // renders for Qwen3: system/user/assistant/tool turns, <think> blocks of assistant turns
  // before the last user query dropped, add_generation_prompt opens an assistant turn, and
  // enable_thinking = false appends an empty think block to it. Without a chat template
  // (GPT-2) the prompt is the contents joined by "\n". Throws Error(invalid_argument) for an
  // empty message list with a template.
  std::string apply_chat_template(std::span<const Message> msgs, bool add_generation_prompt,
                                  bool enable_thinking = true) const;
  // The ids of that prompt, ready to generate from: the template's own markers (<|im_start|>,
  // <|im_end|>) are special tokens, while special-token text inside a message's content is
  // encoded as ordinary text, so a user cannot open a system turn or end the conversation by
  // typing a marker. Equals encode(apply_chat_template(...), true) whenever no content holds
  // special-token text (HF's apply_chat_template(tokenize=True) matches specials anywhere).
  // Without a chat template: the contents joined by "\n", specials as text. Throws as
  // apply_chat_template and encode.
  std::vector<std::int32_t> encode_chat(std::span<const Message> msgs, bool add_generation_prompt,
                                        bool enable_thinking = true) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Turns ids into text one id at a time (for streaming generation): push() returns only whole
// UTF-8 characters, holding back the bytes of a character that later ids complete, so a CJK
// character or emoji split over several ids appears once, whole. Concatenating every push()
// and the final flush() gives decode() of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  std::string push(std::int32_t id);
  // Returns what is held back (invalid bytes as U+FFFD) and resets the decoder.
  std::string flush();

 private:
  Tokenizer tokenizer_;  // a copy shares the tables, so the decoder outlives the caller's
  bool skip_special_;
  std::string pending_;
};

}  // namespace xserv
