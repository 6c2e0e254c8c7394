// The loaded tables behind xserv::Tokenizer (shared by its copies) and the loaders that fill
// them. Internal to lib/tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_vocabulary.hpp"
#include "tokenizer/bpe_model.hpp"
#include "tokenizer/chat_template.hpp"
#include "tokenizer/normalizer.hpp"
#include "tokenizer/regex_splitter.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv {

struct Tokenizer::Impl {
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  std::string source;  // the file the tokenizer came from, for messages
  std::unique_ptr<tokenizer::BpeModel> bpe;
  tokenizer::NormalizationForm normalization = tokenizer::NormalizationForm::none;
  std::vector<tokenizer::RegexSplitter> splitters;  // pre-tokenizer stages, applied in order
  bool add_prefix_space = false;
  tokenizer::AddedTokenMatcher raw_added;         // added tokens with normalized = false
  tokenizer::AddedTokenMatcher normalized_added;  // matched after normalization
  std::vector<std::string> token_text;            // by id: vocabulary form
  std::vector<std::string> token_bytes;           // by id: what the id decodes to
  std::vector<std::uint8_t> special;              // by id
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> token_ids;
  tokenizer::ChatTemplate chat;

  // Tokenizer::encode with special tokens matched only outside the `plain` byte ranges.
  std::vector<std::int32_t> encode(std::string_view text,
                                   std::span<const tokenizer::AddedTokenMatcher::Range> plain) const;
  void encode_segment(std::string_view text, std::vector<std::int32_t>& ids) const;
  void encode_words(std::string_view text, std::vector<std::int32_t>& ids) const;
};

namespace tokenizer {

// What a loader hands to build_tokenizer().
struct TokenizerSpec {
  std::string source;
  std::vector<std::pair<std::string, std::int32_t>> vocab;  // byte-level form -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added;
  NormalizationForm normalization = NormalizationForm::none;
  std::vector<std::string> patterns;  // pre-tokenizer Split patterns, in order
  bool add_prefix_space = false;
  bool ignore_merges = false;
  std::string chat_template;  // Jinja source, empty when none
};

TokenizerSpec read_tokenizer_json(const std::string& path);
TokenizerSpec read_vocab_merges(const std::string& dir);
std::shared_ptr<const Tokenizer::Impl> build_tokenizer(TokenizerSpec spec);

}  // namespace tokenizer
}  // namespace xserv
