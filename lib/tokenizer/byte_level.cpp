#include "tokenizer/byte_level.hpp"

#include <array>

#include "core/utf8.hpp"

namespace xserv::tokenizer {

namespace {

// byte -> code point and its inverse over U+0000..U+0143 (the largest code point used is
// 0x100 + 67 = U+0143); -1 marks a code point outside the alphabet.
struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<int, 0x144> to_byte{};
  Tables() {
    to_byte.fill(-1);
    auto shown = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = shown(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(0x100 + next++);
      to_cp[b] = cp;
      to_byte[cp] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_code_point(unsigned char b) noexcept {
  return tables().to_cp[b];
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_code_point(static_cast<unsigned char>(c)));
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view text) {
  if (!utf8::is_valid(text)) return std::nullopt;
  const auto& t = tables();
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    auto lead = static_cast<unsigned char>(text[i]);
    std::size_t len = utf8::sequence_length(lead);
    char32_t cp = 0;
    if (len == 1) {
      cp = lead;
    } else if (len == 2) {
      cp = (static_cast<char32_t>(lead & 0x1F) << 6) |
           (static_cast<unsigned char>(text[i + 1]) & 0x3F);
    } else {
      return std::nullopt;  // 3- and 4-byte sequences are all above U+0143
    }
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(t.to_byte[cp]);
    i += len;
  }
  return out;
}

}  // namespace xserv::tokenizer
