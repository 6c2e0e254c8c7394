// Splits text with a pre-tokenizer pattern (HF `Split` with behavior Isolated, and the GPT-2
// pattern of `ByteLevel` with use_regex): every match is a piece, and so is every stretch
// between matches.
//
// PCRE2 (JIT, UTF + UCP) runs the pattern: it has the Unicode classes (\p{L}, \p{N}), case-
// insensitive groups and the (?!\S) look-ahead of the GPT-2/Qwen patterns with the same
// backtracking semantics as Oniguruma, the engine behind HF tokenizers. One difference is
// mended: PCRE2's \s also matches U+180E, which left White_Space in Unicode 6.3, so \s and \S are
// rewritten to the White_Space set that Oniguruma uses.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xserv::tokenizer {

class RegexSplitter {
 public:
  // Throws Error(format) when the pattern does not compile.
  explicit RegexSplitter(std::string_view pattern);

  // Appends the pieces of `text` (valid UTF-8, not checked again) to `out`, in order; they
  // concatenate to `text`. Throws Error(resource_exhausted) when the pattern backtracks past
  // PCRE2's match limit on this text (a pathological pattern from a tokenizer file).
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  // The pattern after the \s rewrite (for tests and error messages).
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<const Code> code_;
};

// The pattern of GPT-2's ByteLevel pre-tokenizer (use_regex = true).
inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The pattern of Qwen2/Qwen3 (also what their slow tokenizer uses with vocab.json + merges.txt).
inline constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace xserv::tokenizer
