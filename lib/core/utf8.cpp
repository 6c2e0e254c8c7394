#include "core/utf8.hpp"

namespace xserv::utf8 {

std::size_t sequence_length(unsigned char lead) noexcept {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;  // continuation byte, overlong lead (C0, C1) or > U+10FFFF (F5..FF)
}

namespace {
// Valid range of the second byte given the lead (RFC 3629 table); later bytes are 80..BF.
bool second_byte_ok(unsigned char lead, unsigned char b) noexcept {
  switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;  // no overlong 3-byte forms
    case 0xED: return b >= 0x80 && b <= 0x9F;  // no UTF-16 surrogates
    case 0xF0: return b >= 0x90 && b <= 0xBF;  // no overlong 4-byte forms
    case 0xF4: return b >= 0x80 && b <= 0x8F;  // nothing above U+10FFFF
    default: return b >= 0x80 && b <= 0xBF;
  }
}

// Number of bytes of a valid (possibly truncated) sequence at `i`; 0 when invalid.
// `complete` tells whether all of its bytes are present.
std::size_t check_at(std::string_view s, std::size_t i, bool& complete) noexcept {
  auto lead = static_cast<unsigned char>(s[i]);
  std::size_t len = sequence_length(lead);
  if (len == 0) return 0;
  complete = true;
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      complete = false;
      return k;
    }
    auto b = static_cast<unsigned char>(s[i + k]);
    bool ok = k == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return 0;
  }
  return len;
}
}  // namespace

std::size_t find_invalid(std::string_view text) noexcept {
  std::size_t i = 0;
  while (i < text.size()) {
    bool complete = false;
    std::size_t n = check_at(text, i, complete);
    if (n == 0 || !complete) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::size_t complete_prefix(std::string_view bytes) noexcept {
  // Only the last (up to) 3 bytes can belong to an unfinished sequence.
  std::size_t n = bytes.size();
  std::size_t start = n > 3 ? n - 3 : 0;
  for (std::size_t i = start; i < n; ++i) {
    auto lead = static_cast<unsigned char>(bytes[i]);
    if ((lead & 0xC0) == 0x80) continue;  // continuation byte
    bool complete = false;
    std::size_t len = check_at(bytes, i, complete);
    if (len != 0 && !complete) return i;  // a valid sequence still waiting for bytes
  }
  return n;
}

}  // namespace xserv::utf8
