#include "tokenizer/normalizer.hpp"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.hpp"

namespace xserv::tokenizer {

namespace {

// Code points that are NFC_Quick_Check=Yes, have combining class 0 and never compose with a
// preceding character. Anything that could change under NFC either lies outside these ranges
// itself or needs a following combining mark (which lies outside them).
bool stable_code_point(char32_t c) noexcept {
  if (c < 0x300) return true;                     // ASCII, Latin-1, Latin Extended-A/B, IPA
  if (c >= 0x3000 && c <= 0x3098) return true;    // CJK punctuation, hiragana (not U+3099/309A)
  if (c >= 0x309D && c <= 0x30FF) return true;    // katakana
  if (c >= 0x3400 && c <= 0x4DBF) return true;    // CJK extension A
  if (c >= 0x4E00 && c <= 0x9FFF) return true;    // CJK unified ideographs
  if (c >= 0xAC00 && c <= 0xD7A3) return true;    // Hangul syllables (a trailing jamo is outside)
  if (c >= 0xFF01 && c <= 0xFF9D) return true;    // fullwidth forms, halfwidth katakana
  if (c >= 0x1F300 && c <= 0x1FAFF) return true;  // emoji and pictographs
  if (c >= 0x20000 && c <= 0x2A6DF) return true;  // CJK extension B
  return false;
}

}  // namespace

bool is_trivially_nfc(std::string_view text) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t n = text.size(), i = 0;
  while (i < n) {
    unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    char32_t c = 0;
    std::size_t len = 0;
    if (b < 0xE0) {
      c = b & 0x1F;
      len = 2;
    } else if (b < 0xF0) {
      c = b & 0x0F;
      len = 3;
    } else {
      c = b & 0x07;
      len = 4;
    }
    if (i + len > n) return false;
    for (std::size_t k = 1; k < len; ++k) c = (c << 6) | (p[i + k] & 0x3F);
    if (!stable_code_point(c)) return false;
    i += len;
  }
  return true;
}

std::string normalize(std::string_view text, NormalizationForm form) {
  if (form == NormalizationForm::none || text.empty()) return std::string(text);
  if (form == NormalizationForm::nfc && is_trivially_nfc(text)) return std::string(text);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalizationForm::nfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalizationForm::nfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalizationForm::nfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::nfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalizationForm::none:
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &result,
                                      static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  if (len < 0)
    throw_error(ErrorCode::invalid_argument, "tokenizer: normalization failed: {}",
                utf8proc_errmsg(len));
  return std::string(reinterpret_cast<const char*>(result), static_cast<std::size_t>(len));
}

}  // namespace xserv::tokenizer
