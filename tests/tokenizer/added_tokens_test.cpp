// Added-token rules (lstrip, rstrip, single_word, normalized), the "a b" merge format and
// ignore_merges, on a small synthetic byte-level tokenizer.json: ids 0..255 are the bytes,
// 256.. a few merges, 300.. the added tokens. Expected splits follow HF's AddedVocabulary.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;
using xserv::Tokenizer;
using Ids = std::vector<std::int32_t>;

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Writes a tokenizer.json into a fresh temporary folder and loads it.
Tokenizer make_tokenizer(const std::string& normalizer, bool ignore_merges,
                         const std::string& name) {
  std::string vocab = "{";
  for (int b = 0; b < 256; ++b) {
    vocab += json_string(xserv::tokenizer::byte_level_encode(std::string(1, static_cast<char>(b))));
    vocab += ':';
    vocab += std::to_string(b);
    vocab += ',';
  }
  // "hell" is reachable only through merges; "lo" is in the vocabulary without a merge.
  vocab += R"("he":256,"ll":257,"hell":258,"lo":259})";
  std::string json = R"({"version":"1.0","added_tokens":[
    {"id":300,"content":"<mask>","single_word":false,"lstrip":true,"rstrip":false,"normalized":false,"special":true},
    {"id":301,"content":"[R]","single_word":false,"lstrip":false,"rstrip":true,"normalized":false,"special":true},
    {"id":302,"content":"word","single_word":true,"lstrip":false,"rstrip":false,"normalized":false,"special":false},
    {"id":303,"content":"é","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":false}],
    "normalizer":)" + normalizer +
                     R"(,
    "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
    "decoder":{"type":"ByteLevel"},
    "model":{"type":"BPE","ignore_merges":)" +
                     std::string(ignore_merges ? "true" : "false") + R"(,"vocab":)" + vocab +
                     R"(,"merges":["h e","l l",["he","ll"]]}})";
  fs::path dir = fs::temp_directory_path() / ("xserv_tok_" + name);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json;
  Tokenizer t = Tokenizer::load((dir / "tokenizer.json").string());
  fs::remove_all(dir);
  return t;
}

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace

TEST_CASE("synthetic tokenizer: merges in both formats", "[tokenizer]") {
  Tokenizer t = make_tokenizer("null", false, "merges");
  CHECK(t.vocab_size() == 304);
  CHECK(t.encode("hell") == Ids{258});
  CHECK(t.encode("hello") == Ids{258, 'o'});
  CHECK(t.encode("lo") == Ids{'l', 'o'});  // no merge makes "lo"
  CHECK(t.encode("hhell") == Ids{'h', 258});
  Tokenizer im = make_tokenizer("null", true, "ignore_merges");
  CHECK(im.encode("lo") == Ids{259});  // ignore_merges takes a vocabulary word whole
  CHECK(im.encode("hello") == Ids{258, 'o'});
}

TEST_CASE("synthetic tokenizer: lstrip, rstrip, single_word", "[tokenizer]") {
  Tokenizer t = make_tokenizer("null", false, "rules");
  // lstrip: the token absorbs the spaces on its left.
  CHECK(t.encode("a  <mask>b") == Ids{'a', 300, 'b'});
  CHECK(t.decode(t.encode("a  <mask>b")) == "a<mask>b");
  // rstrip: ... and on its right.
  CHECK(t.encode("[R]  \tx") == Ids{301, 'x'});
  CHECK(t.encode("x [R] [R] y") == cat({t.encode("x "), Ids{301, 301}, Ids{'y'}}));
  // single_word: only where no word character touches it.
  CHECK(t.encode("word") == Ids{302});
  CHECK(t.encode("a word, b") == cat({t.encode("a "), Ids{302}, t.encode(", b")}));
  CHECK(t.encode("swords") == t.encode("swords", false));
  Ids ids = t.encode("sword words word_x (word)");
  CHECK(std::count(ids.begin(), ids.end(), 302) == 1);
  // allow_special = false leaves special tokens as text but keeps the others.
  Ids plain = t.encode("<mask> word", false);
  CHECK(std::count(plain.begin(), plain.end(), 300) == 0);
  CHECK(plain.back() == 302);
}

TEST_CASE("synthetic tokenizer: normalized added tokens match after NFC", "[tokenizer]") {
  Tokenizer nfc = make_tokenizer(R"({"type":"NFC"})", false, "nfc");
  CHECK(nfc.encode("cafe\u0301") == Ids{'c', 'a', 'f', 303});
  CHECK(nfc.encode("caf\u00e9") == Ids{'c', 'a', 'f', 303});
  Tokenizer raw = make_tokenizer("null", false, "raw");
  CHECK(raw.encode("caf\u00e9") == Ids{'c', 'a', 'f', 303});
  CHECK(raw.encode("cafe\u0301") == Ids{'c', 'a', 'f', 'e', 0xCC, 0x81});
  // HF's ByteLevel decoder reads "é" as the alphabet's stand-in for byte 0xE9, so alone it
  // decodes to U+FFFD; a token with a character outside the alphabet decodes to its own UTF-8.
  CHECK(raw.decode(Ids{303}) == "\xEF\xBF\xBD");
  CHECK(raw.decode(Ids{300, 303}) == "<mask>\xEF\xBF\xBD");
}

TEST_CASE("synthetic tokenizer: unsupported parts are refused", "[tokenizer]") {
  CHECK_THROWS_AS(make_tokenizer(R"({"type":"Lowercase"})", false, "lower"), xserv::Error);
  try {
    (void)make_tokenizer(R"({"type":"Lowercase"})", false, "lower2");
  } catch (const xserv::Error& e) {
    CHECK(e.code() == xserv::ErrorCode::unsupported);
  }
}
