// Unicode normalization of tokenizer.json's `normalizer` (NFC for Qwen2/Qwen3, none for GPT-2),
// done by utf8proc: a Debian-packaged library with the Unicode composition tables, which are too
// large and too subtle (canonical ordering, composition exclusions, Hangul) to keep by hand.
#pragma once

#include <string>
#include <string_view>

namespace xserv::tokenizer {

enum class NormalizationForm { none, nfc, nfd, nfkc, nfkd };

// Returns `text` (valid UTF-8) in the given form. For NFC, text made only of characters that
// can neither change nor combine (ASCII, Latin-1, CJK ideographs, kana, Hangul syllables,
// emoji) is returned as is without calling utf8proc: the common case costs one scan.
std::string normalize(std::string_view text, NormalizationForm form);

// True when NFC leaves `text` unchanged for the reason above (conservative: false may still
// mean that NFC changes nothing).
bool is_trivially_nfc(std::string_view text) noexcept;

}  // namespace xserv::tokenizer
