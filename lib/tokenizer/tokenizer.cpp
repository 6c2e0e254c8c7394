#include "tokenizer/tokenizer.hpp"

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "tokenizer/byte_level.hpp"
#include "tokenizer/tokenizer_impl.hpp"

namespace xserv {

using tokenizer::AddedToken;
using tokenizer::AddedTokenMatcher;

namespace {

namespace fs = std::filesystem;

// Appends `bytes`, replacing each maximal invalid subsequence with U+FFFD (the Unicode
// "substitution of maximal subparts" practice that Rust's from_utf8_lossy follows).
void append_lossy_utf8(std::string& out, std::string_view bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    std::size_t bad = utf8::find_invalid(bytes.substr(i));
    if (bad == std::string_view::npos) {
      out.append(bytes.substr(i));
      return;
    }
    out.append(bytes.substr(i, bad));
    i += bad;
    // Length of the maximal subpart: the lead byte plus continuation bytes that still fit it.
    auto lead = static_cast<unsigned char>(bytes[i]);
    std::size_t len = utf8::sequence_length(lead), k = 1;
    if (len > 1) {
      for (; k < len && i + k < bytes.size(); ++k) {
        auto b = static_cast<unsigned char>(bytes[i + k]);
        unsigned char lo = 0x80, hi = 0xBF;
        if (k == 1) {
          if (lead == 0xE0) lo = 0xA0;
          if (lead == 0xED) hi = 0x9F;
          if (lead == 0xF0) lo = 0x90;
          if (lead == 0xF4) hi = 0x8F;
        }
        if (b < lo || b > hi) break;
      }
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
}

}  // namespace

namespace tokenizer {

std::shared_ptr<const Tokenizer::Impl> build_tokenizer(TokenizerSpec spec) {
  auto impl = std::make_shared<Tokenizer::Impl>();
  impl->source = spec.source;
  std::int32_t max_id = -1;
  for (const auto& [s, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const auto& t : spec.added) max_id = std::max(max_id, t.id);
  XSERV_CHECK(max_id >= 0, ErrorCode::format, "{}: empty vocabulary", spec.source);
  // Tables are indexed by id: refuse ids so sparse that a corrupt file would allocate gigabytes.
  const std::size_t listed = spec.vocab.size() + spec.added.size();
  XSERV_CHECK(static_cast<std::size_t>(max_id) < 4 * listed + 4096, ErrorCode::format,
              "{}: token id {} is far beyond the {} tokens listed", spec.source, max_id, listed);
  const auto n = static_cast<std::size_t>(max_id) + 1;
  impl->token_text.resize(n);
  impl->token_bytes.resize(n);
  impl->special.assign(n, 0);
  impl->token_ids.reserve(spec.vocab.size() + spec.added.size());
  for (auto& [s, id] : spec.vocab) {
    XSERV_CHECK(impl->token_ids.emplace(s, id).second, ErrorCode::format,
                "{}: token '{}' listed twice", spec.source, s);
    impl->token_text[id] = std::move(s);
  }
  // Merges and bytes are resolved against the model vocabulary alone (added tokens come next).
  auto vocab_id = [&](std::string_view s) -> std::int32_t {
    auto it = impl->token_ids.find(s);
    return it == impl->token_ids.end() ? -1 : it->second;
  };
  std::int32_t byte_ids[256];
  for (int b = 0; b < 256; ++b)
    byte_ids[b] = vocab_id(byte_level_encode(std::string(1, static_cast<char>(b))));
  std::vector<BpeModel::Merge> merges;
  std::vector<std::int32_t> merged_ids;
  merges.reserve(spec.merges.size());
  merged_ids.reserve(spec.merges.size());
  std::string joined;
  for (const auto& [a, b] : spec.merges) {
    joined.assign(a).append(b);
    std::int32_t ia = vocab_id(a), ib = vocab_id(b), iab = vocab_id(joined);
    if (ia < 0 || ib < 0 || iab < 0)
      throw_error(ErrorCode::format, "{}: merge '{} {}' uses a token missing from the vocabulary",
                  spec.source, a, b);
    merges.push_back({ia, ib});
    merged_ids.push_back(iab);
  }
  std::unordered_map<std::string, std::int32_t> word_ids;
  if (spec.ignore_merges) {
    for (const auto& [s, id] : impl->token_ids)
      if (auto raw = byte_level_decode(s)) word_ids.emplace(std::move(*raw), id);
  }
  impl->bpe = std::make_unique<BpeModel>(byte_ids, merges, merged_ids, spec.ignore_merges,
                                         std::move(word_ids));

  std::vector<AddedToken> raw_added, normalized_added;
  for (auto& t : spec.added) {
    XSERV_CHECK(!t.content.empty(), ErrorCode::format, "{}: added token {} is empty", spec.source,
                t.id);
    XSERV_CHECK(utf8::is_valid(t.content), ErrorCode::format, "{}: added token {} is not UTF-8",
                spec.source, t.id);
    if (impl->token_text[t.id].empty()) impl->token_text[t.id] = t.content;
    impl->token_ids[t.content] = t.id;
    impl->special[t.id] = t.special ? 1 : 0;
    // A normalized token is matched in normalized text, so its content is normalized too.
    if (t.normalized && spec.normalization != tokenizer::NormalizationForm::none)
      t.content = normalize(t.content, spec.normalization);
    (t.normalized ? normalized_added : raw_added).push_back(t);
  }
  impl->raw_added = AddedTokenMatcher(std::move(raw_added));
  impl->normalized_added = AddedTokenMatcher(std::move(normalized_added));

  // What each id decodes to (HF's ByteLevel decoder): the bytes its characters stand for, or,
  // when a character is outside the byte alphabet (added tokens such as "<|im_end|>" that use
  // only printable ASCII do map), the token's own UTF-8.
  for (std::size_t id = 0; id < n; ++id) {
    const std::string& s = impl->token_text[id];
    if (auto raw = byte_level_decode(s)) {
      impl->token_bytes[id] = std::move(*raw);
    } else {
      impl->token_bytes[id] = s;
    }
  }

  impl->normalization = spec.normalization;
  impl->add_prefix_space = spec.add_prefix_space;
  for (const auto& p : spec.patterns) impl->splitters.emplace_back(p);
  impl->chat = ChatTemplate::detect(spec.chat_template);
  return impl;
}

}  // namespace tokenizer

Tokenizer Tokenizer::load(const std::string& path) {
  // fs::exists, not is_regular_file: a FIFO or device named tokenizer.json must be refused by
  // the reader (Error(io)), not skipped in favour of another file or reported as missing.
  std::error_code ec;
  fs::path p(path);
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "tokenizer.json", ec))
      return Tokenizer(tokenizer::build_tokenizer(
          tokenizer::read_tokenizer_json((p / "tokenizer.json").string())));
    if (fs::exists(p / "vocab.json", ec) && fs::exists(p / "merges.txt", ec))
      return Tokenizer(tokenizer::build_tokenizer(tokenizer::read_vocab_merges(p.string())));
    throw_error(ErrorCode::not_found, "{}: no tokenizer.json nor vocab.json + merges.txt", path);
  }
  if (!fs::exists(p, ec))
    throw_error(ErrorCode::not_found, "{}: no such tokenizer file or directory", path);
  if (p.filename() == "vocab.json" || p.filename() == "merges.txt")
    return Tokenizer(
        tokenizer::build_tokenizer(tokenizer::read_vocab_merges(p.parent_path().string())));
  return Tokenizer(tokenizer::build_tokenizer(tokenizer::read_tokenizer_json(p.string())));
}

void Tokenizer::Impl::encode_words(std::string_view text, std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.append(" ").append(text);
    text = prefixed;
  }
  if (splitters.empty()) {
    bpe->encode_word(text, ids);
    return;
  }
  // Pieces of one stage are split by the next; the last stage's pieces are the words.
  thread_local std::vector<std::string_view> pieces, next;
  pieces.clear();
  splitters[0].split(text, pieces);
  for (std::size_t s = 1; s < splitters.size(); ++s) {
    next.clear();
    for (auto piece : pieces) splitters[s].split(piece, next);
    pieces.swap(next);
  }
  bpe->encode_words(pieces, ids);
}

void Tokenizer::Impl::encode_segment(std::string_view text, std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (normalization != tokenizer::NormalizationForm::none &&
      !(normalization == tokenizer::NormalizationForm::nfc && tokenizer::is_trivially_nfc(text))) {
    normalized = tokenizer::normalize(text, normalization);
    text = normalized;
  }
  if (normalized_added.empty()) {
    encode_words(text, ids);
    return;
  }
  std::vector<AddedTokenMatcher::Match> matches;
  normalized_added.find(text, true, matches);
  std::size_t pos = 0;
  for (const auto& m : matches) {
    encode_words(text.substr(pos, m.start - pos), ids);
    ids.push_back(m.id);
    pos = m.end;
  }
  encode_words(text.substr(pos), ids);
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  const AddedTokenMatcher::Range all{0, text.size()};
  return impl_->encode(text, allow_special ? std::span<const AddedTokenMatcher::Range>()
                                           : std::span<const AddedTokenMatcher::Range>(&all, 1));
}

std::vector<std::int32_t> Tokenizer::Impl::encode(
    std::string_view text, std::span<const AddedTokenMatcher::Range> plain) const {
  std::size_t bad = utf8::find_invalid(text);
  if (bad != std::string_view::npos)
    throw_error(ErrorCode::invalid_argument, "encode: input is not valid UTF-8 (byte offset {})",
                bad);
  const Impl& im = *this;
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<AddedTokenMatcher::Match> matches;
  im.raw_added.find(text, plain, matches);
  std::size_t pos = 0;
  for (const auto& m : matches) {
    im.encode_segment(text.substr(pos, m.start - pos), ids);
    ids.push_back(m.id);
    pos = m.end;
  }
  im.encode_segment(text.substr(pos), ids);
  return ids;
}

std::string Tokenizer::decode_bytes(std::span<const std::int32_t> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string out;
  const auto n = static_cast<std::int32_t>(im.token_bytes.size());
  for (std::int32_t id : ids) {
    if (id < 0 || id >= n || (skip_special && im.special[id])) continue;
    out += im.token_bytes[id];
  }
  return out;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string bytes = decode_bytes(ids, skip_special);
  if (utf8::is_valid(bytes)) return bytes;
  std::string out;
  append_lossy_utf8(out, bytes);
  return out;
}

std::int32_t Tokenizer::vocab_size() const {
  return static_cast<std::int32_t>(impl_->token_text.size());
}

std::optional<std::int32_t> Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->token_ids.find(token);
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

std::string_view Tokenizer::token_text(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->token_text[id];
}

std::string_view Tokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->token_bytes[id];
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id] != 0;
}

bool Tokenizer::has_chat_template() const {
  return impl_->chat.kind != tokenizer::ChatTemplate::Kind::none;
}

std::string Tokenizer::apply_chat_template(std::span<const Message> msgs,
                                           bool add_generation_prompt, bool enable_thinking) const {
  if (!has_chat_template()) {
    std::string out;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (i) out += '\n';
      out += msgs[i].content;
    }
    return out;
  }
  return tokenizer::render_chat(impl_->chat, msgs, add_generation_prompt, enable_thinking);
}

std::vector<std::int32_t> Tokenizer::encode_chat(std::span<const Message> msgs,
                                                 bool add_generation_prompt,
                                                 bool enable_thinking) const {
  if (!has_chat_template()) return encode(apply_chat_template(msgs, add_generation_prompt), false);
  std::vector<AddedTokenMatcher::Range> content;
  const std::string text =
      tokenizer::render_chat(impl_->chat, msgs, add_generation_prompt, enable_thinking, &content);
  return impl_->encode(text, content);
}

std::string StreamDecoder::push(std::int32_t id) {
  std::int32_t one[1] = {id};
  pending_ += tokenizer_.decode_bytes(one, skip_special_);
  std::size_t n = utf8::complete_prefix(pending_);
  if (n == 0) return {};
  std::string out;
  append_lossy_utf8(out, std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  append_lossy_utf8(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace xserv
