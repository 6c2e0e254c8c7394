#include "tokenizer/added_vocabulary.hpp"

#include <utf8proc.h>

#include <algorithm>

#include "core/utf8.hpp"

namespace xserv::tokenizer {

namespace {

// Decodes the code point that ends at `end` (text is valid UTF-8) and its start.
char32_t last_code_point(std::string_view text, std::size_t end, std::size_t& start) {
  std::size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  start = i;
  utf8proc_int32_t cp = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                   static_cast<utf8proc_ssize_t>(end - i), &cp);
  return static_cast<char32_t>(cp < 0 ? 0xFFFD : cp);
}

char32_t first_code_point(std::string_view text, std::size_t begin, std::size_t& len) {
  utf8proc_int32_t cp = 0;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + begin),
                            static_cast<utf8proc_ssize_t>(text.size() - begin), &cp);
  len = n > 0 ? static_cast<std::size_t>(n) : 1;
  return static_cast<char32_t>(cp < 0 ? 0xFFFD : cp);
}

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// HF's single_word test uses Rust regex \w: Alphabetic, marks, decimal digits, connector
// punctuation and the join controls (letters stand in for Alphabetic, which adds a few symbols).
bool is_word_char(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens)
    : tokens_(std::move(tokens)), by_first_(256) {
  for (std::uint32_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].content.empty()) continue;
    by_first_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& list : by_first_) {
    std::stable_sort(list.begin(), list.end(), [&](std::uint32_t a, std::uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

void AddedTokenMatcher::find(std::string_view text, bool allow_special,
                             std::vector<Match>& out) const {
  const Range all{0, text.size()};
  find(text, allow_special ? std::span<const Range>() : std::span<const Range>(&all, 1), out);
}

void AddedTokenMatcher::find(std::string_view text, std::span<const Range> plain,
                             std::vector<Match>& out) const {
  if (tokens_.empty()) return;
  std::size_t next_plain = 0;  // the first plain range not wholly before the current match
  auto touches_plain = [&](std::size_t start, std::size_t stop) {
    while (next_plain < plain.size() && plain[next_plain].end <= start) ++next_plain;
    return next_plain < plain.size() && plain[next_plain].begin < stop;
  };
  std::size_t taken = 0;  // end of the previous accepted match (its rstrip included)
  std::size_t i = 0;
  while (i < text.size()) {
    const auto& cands = by_first_[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (std::uint32_t k : cands) {
      const auto& c = tokens_[k].content;
      if (text.compare(i, c.size(), c) == 0) {
        hit = &tokens_[k];
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::size_t start = i, stop = i + hit->content.size();
    i = stop;  // matches never overlap, even those dropped below (as with HF's automaton)
    if (hit->special && touches_plain(start, stop)) continue;
    if (hit->single_word) {
      std::size_t s = 0, len = 0;
      bool word_before = start > 0 && is_word_char(last_code_point(text, start, s));
      bool word_after = stop < text.size() && is_word_char(first_code_point(text, stop, len));
      if (word_before || word_after) continue;
    }
    if (hit->lstrip) {
      std::size_t s = start;
      while (s > 0) {
        std::size_t cs = 0;
        if (!is_white_space(last_code_point(text, s, cs))) break;
        s = cs;
      }
      start = std::max(s, taken);
    }
    if (hit->rstrip) {
      while (stop < text.size()) {
        std::size_t len = 0;
        if (!is_white_space(first_code_point(text, stop, len))) break;
        stop += len;
      }
      i = stop;
    }
    taken = stop;
    out.push_back(Match{start, stop, hit->id});
  }
}

}  // namespace xserv::tokenizer
