#include "engine/output_processor.hpp"

#include <algorithm>

namespace xserv {

namespace {

// Earliest match of any stop string that ends past byte `from` of `text` (matches ending
// earlier were found by earlier calls); npos when none.
std::size_t find_stop(const std::string& text, std::size_t from,
                      const std::vector<std::string>& stops) {
  std::size_t best = std::string::npos;
  for (const auto& s : stops) {
    const std::size_t start = from >= s.size() - 1 ? from - (s.size() - 1) : 0;
    const std::size_t p = text.find(s, start);
    if (p != std::string::npos) best = std::min(best, p);
  }
  return best;
}

// Length of the longest suffix of text[emitted..] that is a proper prefix of a stop string: the
// bytes that must be held back because the next token may complete a match.
std::size_t held_suffix(const std::string& text, std::size_t emitted,
                        const std::vector<std::string>& stops) {
  std::size_t held = 0;
  const std::size_t avail = text.size() - emitted;
  for (const auto& s : stops) {
    for (std::size_t len = std::min(avail, s.size() - 1); len > held; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        held = len;
        break;
      }
    }
  }
  return held;
}

}  // namespace

OutputProcessor::OutputProcessor(const Tokenizer* tokenizer, const SamplingParams& params,
                                 std::span<const std::int32_t> eos_ids)
    : params_(params), eos_ids_(eos_ids) {
  if (tokenizer) decoder_.emplace(*tokenizer);
}

bool OutputProcessor::add_text(const std::string& piece) {
  if (piece.empty() || params_.stop_strings.empty()) {
    text_ += piece;
    return false;
  }
  const std::size_t from = text_.size();
  text_ += piece;
  const std::size_t at = find_stop(text_, from, params_.stop_strings);
  if (at == std::string::npos) return false;
  text_.resize(at);
  return true;
}

OutputProcessor::Step OutputProcessor::append(Sequence& seq, std::int32_t id) {
  seq.tokens.push_back(id);
  const SamplingParams& p = params_;
  Step step;
  bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) !=
                 p.stop_token_ids.end();
  if (!p.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end())
    stop_id = true;
  if (stop_id) {
    step.finish = FinishReason::stop;  // a stop id's own text is not shown
  } else if (decoder_ && add_text(decoder_->push(id))) {
    step.finish = FinishReason::stop;
  } else if (seq.generated() >= p.max_tokens || seq.num_tokens() >= seq.max_len) {
    step.finish = FinishReason::length;
  }
  // An ending sample releases what it held back (an unfinished UTF-8 tail, a partial stop
  // string) unless a stop string cut it.
  std::size_t release_end = text_.size();
  if (step.finish == FinishReason::none) {
    release_end -= held_suffix(text_, emitted_, p.stop_strings);
  } else if (decoder_ && (step.finish == FinishReason::length || stop_id)) {
    if (add_text(decoder_->flush())) step.finish = FinishReason::stop;
    release_end = text_.size();
  }
  release_end = std::max(release_end, emitted_);
  step.text.assign(text_, emitted_, release_end - emitted_);
  emitted_ = release_end;
  return step;
}

}  // namespace xserv
