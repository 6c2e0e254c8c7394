#include <catch2/catch.hpp>
#include <string>

#include "core/utf8.hpp"

using namespace xserv;

TEST_CASE("UTF-8 validation accepts valid text of every length", "[core][utf8]") {
  CHECK(utf8::is_valid(""));
  CHECK(utf8::is_valid("hello"));
  CHECK(utf8::is_valid("caf\xC3\xA9"));                 // é
  CHECK(utf8::is_valid("\xE4\xB8\xAD\xE6\x96\x87"));    // 中文
  CHECK(utf8::is_valid("\xF0\x9F\x98\x80"));            // 😀
  CHECK(utf8::is_valid("\xF4\x8F\xBF\xBF"));            // U+10FFFF
}

TEST_CASE("UTF-8 validation rejects malformed sequences at their offset", "[core][utf8]") {
  CHECK(utf8::find_invalid("ab\x80") == 2);              // lone continuation
  CHECK(utf8::find_invalid("\xC0\xAF") == 0);            // overlong '/'
  CHECK(utf8::find_invalid("\xE0\x80\xAF") == 0);        // overlong 3-byte
  CHECK(utf8::find_invalid("x\xED\xA0\x80") == 1);       // UTF-16 surrogate U+D800
  CHECK(utf8::find_invalid("\xF4\x90\x80\x80") == 0);    // > U+10FFFF
  CHECK(utf8::find_invalid("\xF5\x80\x80\x80") == 0);    // invalid lead
  CHECK(utf8::find_invalid("ok\xE4\xB8") == 2);          // truncated at the end
  CHECK(utf8::find_invalid("\xE4\x41\xAD") == 0);        // bad continuation
  CHECK(utf8::find_invalid(std::string("a\0b", 3)) == std::string_view::npos);  // NUL is valid
}

TEST_CASE("complete_prefix holds back an unfinished trailing character", "[core][utf8]") {
  std::string emoji = "\xF0\x9F\x98\x80";
  for (std::size_t cut = 1; cut < 4; ++cut) {
    std::string s = "hi" + emoji.substr(0, cut);
    CHECK(utf8::complete_prefix(s) == 2);
  }
  CHECK(utf8::complete_prefix("hi" + emoji) == 6);
  CHECK(utf8::complete_prefix("abc") == 3);
  // Invalid bytes are not "unfinished": they pass through for the caller to handle.
  CHECK(utf8::complete_prefix("a\xFF") == 2);
}
