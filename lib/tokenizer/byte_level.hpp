// GPT-2's byte-level alphabet. Byte-level BPE vocabularies (GPT-2, Qwen, Llama 3) store tokens as
// JSON strings in which every raw byte 0..255 is shown as one printable code point: printable
// Latin-1 bytes stand for themselves, the others are moved to U+0100.. in byte order (space is
// 'Ġ' U+0120, newline 'Ċ' U+010A). xserv works on raw bytes internally and converts at load time.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace xserv::tokenizer {

// The code point that stands for byte `b`.
char32_t byte_to_code_point(unsigned char b) noexcept;

// The byte-level form (UTF-8) of raw bytes, e.g. " hi" -> "Ġhi".
std::string byte_level_encode(std::string_view bytes);

// The raw bytes that a byte-level string stands for; nullopt when it holds a code point outside
// the alphabet (or is not valid UTF-8).
std::optional<std::string> byte_level_decode(std::string_view text);

// Appends the UTF-8 form of code point `cp` (must be a Unicode scalar value).
void append_utf8(std::string& out, char32_t cp);

}  // namespace xserv::tokenizer
