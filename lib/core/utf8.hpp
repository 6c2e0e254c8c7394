// UTF-8 helpers shared by the tokenizer, the streaming decoder and the C facade.
#pragma once

#include <cstddef>
#include <string_view>

namespace xserv::utf8 {

// Length in bytes of the sequence a lead byte starts (1..4), or 0 for a byte that cannot lead.
std::size_t sequence_length(unsigned char lead) noexcept;

// Byte offset of the first invalid sequence (overlong forms, surrogates, > U+10FFFF and
// truncated sequences are invalid), or npos when the whole text is valid UTF-8.
std::size_t find_invalid(std::string_view text) noexcept;
inline bool is_valid(std::string_view text) noexcept {
  return find_invalid(text) == std::string_view::npos;
}

// Length of the longest prefix of `bytes` that ends on a character boundary, treating a valid
// but unfinished sequence at the end as not yet complete. The streaming decoder emits this
// prefix and keeps the rest until more bytes arrive.
std::size_t complete_prefix(std::string_view bytes) noexcept;

}  // namespace xserv::utf8
