// OutputProcessor: turns one sample's sampled ids into text and decides when it ends.
//
// Per sampled id: append it to the sequence, then the stop rules in order — a stop id or an eos
// id (unless ignore_eos), a stop string completed by the new text (the text is cut before it),
// max_tokens, the model's context. Text goes through the streaming detokenizer (only whole UTF-8
// characters) and is held back while its end may start a stop string; a sample that ends
// releases what was held back unless a stop string cut it. Concatenating the text of a sample's
// events gives text().
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.hpp"
#include "engine/sequence.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv {

class OutputProcessor {
 public:
  // tokenizer may be null (no text; stop strings are then rejected at submit).
  OutputProcessor(const Tokenizer* tokenizer, const SamplingParams& params,
                  std::span<const std::int32_t> eos_ids);

  struct Step {
    FinishReason finish = FinishReason::none;
    std::string text;  // newly safe to show
  };
  // Appends `id` to seq.tokens and applies the stop rules.
  Step append(Sequence& seq, std::int32_t id);

  // The text handed out so far (what the events carried).
  std::string_view text() const noexcept { return std::string_view(text_).substr(0, emitted_); }

 private:
  bool add_text(const std::string& piece);  // true when a stop string matched (text cut there)

  const SamplingParams& params_;
  std::span<const std::int32_t> eos_ids_;
  std::optional<StreamDecoder> decoder_;
  std::string text_;         // decoded so far (cut at a stop string)
  std::size_t emitted_ = 0;  // bytes of text_ already handed out
};

}  // namespace xserv
