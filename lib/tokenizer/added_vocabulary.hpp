// Added tokens (`added_tokens` of tokenizer.json): strings such as <|im_start|> that are cut out
// of the text before normalization and BPE and become one id each. Matching follows HF's
// AddedVocabulary: leftmost-longest non-overlapping matches over all added tokens, then per
// match the single_word / lstrip / rstrip rules, and special tokens are skipped (left as
// ordinary text) when the caller asks for that.
//
// Matching needs no regex: a table of possible first bytes finds candidates, and the tokens
// starting with that byte are tried longest first.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xserv::tokenizer {

struct AddedToken {
  std::string content;
  std::int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  struct Match {
    std::size_t start, end;  // byte range of the text that the token replaces
    std::int32_t id;
  };
  // Matches in `text` in order; with allow_special = false special tokens are not matched.
  void find(std::string_view text, bool allow_special, std::vector<Match>& out) const;

  // A byte range [begin, end) of a text.
  struct Range {
    std::size_t begin, end;
  };
  // As find(), but a special token is matched only where it touches none of the `plain` ranges
  // (sorted, disjoint): there it stays ordinary text. A rendered chat prompt passes its
  // messages' contents, so its own turn markers are tokens and a user's typed ones are not.
  void find(std::string_view text, std::span<const Range> plain, std::vector<Match>& out) const;

 private:
  std::vector<AddedToken> tokens_;
  // by_first_[b]: indices into tokens_ of the tokens that start with byte b, longest first.
  std::vector<std::vector<std::uint32_t>> by_first_;
};

}  // namespace xserv::tokenizer
