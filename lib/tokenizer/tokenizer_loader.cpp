// Reads tokenizer.json, or vocab.json + merges.txt (+ tokenizer_config.json), into a
// TokenizerSpec. Only what byte-level BPE needs is accepted; anything else is refused with
// Error(unsupported) rather than silently encoded differently from Hugging Face.
#include <simdjson.h>

#include <cctype>
#include <filesystem>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "tokenizer/tokenizer_impl.hpp"

namespace xserv::tokenizer {

namespace fs = std::filesystem;

namespace {

// Every tokenizer file is read through read_file: regular files only (a FIFO would block the
// load), at most kMaxTokenizerFileBytes (a link to /dev/zero or a 10 GB file is refused before
// it is read).
std::string read_text_file(const std::string& path) {
  return read_file(path, kMaxTokenizerFileBytes);
}

simdjson::dom::element parse_json(simdjson::dom::parser& parser, const std::string& text,
                                  const std::string& path) {
  simdjson::dom::element root;
  auto err = parser.parse(text).get(root);
  if (err)
    throw_error(ErrorCode::format, "{}: invalid JSON: {}", path, simdjson::error_message(err));
  return root;
}

std::string_view get_string(simdjson::dom::element e, std::string_view key,
                            const std::string& path) {
  std::string_view s;
  if (e[key].get_string().get(s) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: field '{}' must be a string", path, key);
  return s;
}

// An optional field: `fallback` when absent or null, Error(format) when of another type.
bool get_bool(simdjson::dom::element e, std::string_view key, bool fallback,
              const std::string& path) {
  simdjson::dom::element v;
  if (e[key].get(v) != simdjson::SUCCESS || v.is_null()) return fallback;
  bool b = false;
  if (v.get_bool().get(b) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: field '{}' must be true or false", path, key);
  return b;
}

std::string_view get_type(simdjson::dom::element e, const std::string& path,
                          std::string_view what) {
  std::string_view type;
  if (e["type"].get_string().get(type) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: {} has no 'type'", path, what);
  return type;
}

std::int32_t to_id(simdjson::dom::element v, const std::string& path, std::string_view what) {
  std::int64_t id = 0;
  if (v.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id > 0x7FFFFFFF)
    throw_error(ErrorCode::format, "{}: {} has no valid id", path, what);
  return static_cast<std::int32_t>(id);
}

std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

void read_normalizer(simdjson::dom::element e, TokenizerSpec& spec, const std::string& path) {
  if (e.is_null()) return;
  std::string_view type = get_type(e, path, "normalizer");
  if (type == "Sequence") {
    simdjson::dom::array list;
    if (e["normalizers"].get_array().get(list) != simdjson::SUCCESS)
      throw_error(ErrorCode::format, "{}: Sequence normalizer without 'normalizers'", path);
    for (auto child : list) read_normalizer(child, spec, path);
    return;
  }
  NormalizationForm form;
  if (type == "NFC")
    form = NormalizationForm::nfc;
  else if (type == "NFD")
    form = NormalizationForm::nfd;
  else if (type == "NFKC")
    form = NormalizationForm::nfkc;
  else if (type == "NFKD")
    form = NormalizationForm::nfkd;
  else
    throw_error(ErrorCode::unsupported, "{}: normalizer '{}' is not supported", path, type);
  if (spec.normalization != NormalizationForm::none && spec.normalization != form)
    throw_error(ErrorCode::unsupported, "{}: more than one Unicode normalization", path);
  spec.normalization = form;
}

void read_pre_tokenizer(simdjson::dom::element e, TokenizerSpec& spec, bool& byte_level,
                        const std::string& path) {
  if (e.is_null()) return;
  std::string_view type = get_type(e, path, "pre_tokenizer");
  if (type == "Sequence") {
    simdjson::dom::array list;
    if (e["pretokenizers"].get_array().get(list) != simdjson::SUCCESS)
      throw_error(ErrorCode::format, "{}: Sequence pre_tokenizer without 'pretokenizers'", path);
    for (auto child : list) read_pre_tokenizer(child, spec, byte_level, path);
  } else if (type == "ByteLevel") {
    byte_level = true;
    spec.add_prefix_space = get_bool(e, "add_prefix_space", false, path);
    if (get_bool(e, "use_regex", true, path)) spec.patterns.emplace_back(gpt2_pattern);
  } else if (type == "Split") {
    std::string_view behavior = get_string(e, "behavior", path);
    if (behavior != "Isolated" || get_bool(e, "invert", false, path))
      throw_error(ErrorCode::unsupported,
                  "{}: Split pre-tokenizer with behavior '{}'{} is not supported", path, behavior,
                  get_bool(e, "invert", false, path) ? " and invert" : "");
    // Checked access: simdjson's implicit conversion would throw its own exception type (found
    // by fuzz_tokenizer_json on a Split pre-tokenizer without "pattern").
    simdjson::dom::element pattern;
    std::string_view s;
    if (e["pattern"].get(pattern) != simdjson::SUCCESS) {
      throw_error(ErrorCode::format, "{}: Split pre-tokenizer without a pattern", path);
    } else if (pattern["Regex"].get_string().get(s) == simdjson::SUCCESS) {
      spec.patterns.emplace_back(s);
    } else if (pattern["String"].get_string().get(s) == simdjson::SUCCESS) {
      spec.patterns.push_back(escape_literal(s));
    } else {
      throw_error(ErrorCode::format, "{}: Split pre-tokenizer without a pattern", path);
    }
  } else {
    throw_error(ErrorCode::unsupported, "{}: pre-tokenizer '{}' is not supported", path, type);
  }
}

AddedToken read_added_token(simdjson::dom::element e, std::int32_t id, const std::string& path) {
  AddedToken t;
  t.id = id;
  t.content = std::string(get_string(e, "content", path));
  t.special = get_bool(e, "special", false, path);
  t.lstrip = get_bool(e, "lstrip", false, path);
  t.rstrip = get_bool(e, "rstrip", false, path);
  t.single_word = get_bool(e, "single_word", false, path);
  t.normalized = get_bool(e, "normalized", !t.special, path);
  return t;
}

// tokenizer_config.json's chat_template: a string, or a list of {name, template} of which the
// one named "default" is used.
std::string read_config_chat_template(simdjson::dom::element config) {
  simdjson::dom::element t;
  if (config["chat_template"].get(t) != simdjson::SUCCESS) return {};
  std::string_view s;
  if (t.get_string().get(s) == simdjson::SUCCESS) return std::string(s);
  simdjson::dom::array list;
  if (t.get_array().get(list) == simdjson::SUCCESS) {
    for (auto item : list) {
      std::string_view name, text;
      if (item["name"].get_string().get(name) == simdjson::SUCCESS && name == "default" &&
          item["template"].get_string().get(text) == simdjson::SUCCESS)
        return std::string(text);
    }
  }
  return {};
}

// The chat template beside the tokenizer files: chat_template.jinja (what transformers writes
// today) first, else tokenizer_config.json's field.
std::string read_chat_template(const fs::path& dir, simdjson::dom::parser& parser) {
  std::error_code ec;
  fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja, ec)) return read_text_file(jinja.string());
  fs::path config = dir / "tokenizer_config.json";
  if (!fs::exists(config, ec)) return {};
  std::string text = read_text_file(config.string());
  return read_config_chat_template(parse_json(parser, text, config.string()));
}

}  // namespace

TokenizerSpec read_tokenizer_json(const std::string& path) {
  TokenizerSpec spec;
  spec.source = path;
  std::string text = read_text_file(path);
  simdjson::dom::parser parser;
  simdjson::dom::element root = parse_json(parser, text, path);

  simdjson::dom::element model;
  if (root["model"].get(model) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: no 'model'", path);
  std::string_view model_type;
  if (model["type"].get_string().get(model_type) == simdjson::SUCCESS && model_type != "BPE")
    throw_error(ErrorCode::unsupported, "{}: model '{}' is not supported (byte-level BPE only)",
                path, model_type);
  if (get_bool(model, "byte_fallback", false, path))
    throw_error(ErrorCode::unsupported, "{}: BPE with byte_fallback is not supported", path);
  for (std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    std::string_view s;
    if (model[key].get_string().get(s) == simdjson::SUCCESS && !s.empty())
      throw_error(ErrorCode::unsupported, "{}: BPE with {} is not supported", path, key);
  }
  spec.ignore_merges = get_bool(model, "ignore_merges", false, path);

  simdjson::dom::object vocab;
  if (model["vocab"].get_object().get(vocab) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: model has no 'vocab' object", path);
  spec.vocab.reserve(vocab.size());
  for (auto [key, value] : vocab)
    spec.vocab.emplace_back(std::string(key), to_id(value, path, "a vocab entry"));

  simdjson::dom::array merges;
  if (model["merges"].get_array().get(merges) != simdjson::SUCCESS)
    throw_error(ErrorCode::format, "{}: model has no 'merges' list", path);
  spec.merges.reserve(merges.size());
  for (auto m : merges) {
    std::string_view s;
    simdjson::dom::array pair;
    if (m.get_string().get(s) == simdjson::SUCCESS) {  // older form: "a b"
      auto sp = s.find(' ');
      if (sp == std::string_view::npos || s.find(' ', sp + 1) != std::string_view::npos)
        throw_error(ErrorCode::format, "{}: merge '{}' is not two tokens", path, s);
      spec.merges.emplace_back(std::string(s.substr(0, sp)), std::string(s.substr(sp + 1)));
    } else if (m.get_array().get(pair) == simdjson::SUCCESS && pair.size() == 2) {
      std::string_view a, b;
      if (pair.at(0).get_string().get(a) || pair.at(1).get_string().get(b))
        throw_error(ErrorCode::format, "{}: a merge is not a pair of strings", path);
      spec.merges.emplace_back(std::string(a), std::string(b));
    } else {
      throw_error(ErrorCode::format, "{}: a merge is neither \"a b\" nor [a, b]", path);
    }
  }

  simdjson::dom::array added;
  if (root["added_tokens"].get_array().get(added) == simdjson::SUCCESS) {
    for (auto t : added) {
      // A checked lookup: converting a failed one (no "id") to an element would throw
      // simdjson's own exception (found by fuzz_tokenizer_json).
      simdjson::dom::element id;
      if (t["id"].get(id) != simdjson::SUCCESS)
        throw_error(ErrorCode::format, "{}: an added token has no id", path);
      spec.added.push_back(read_added_token(t, to_id(id, path, "an added token"), path));
    }
  }

  simdjson::dom::element e;
  if (root["normalizer"].get(e) == simdjson::SUCCESS) read_normalizer(e, spec, path);
  bool byte_level = false;
  if (root["pre_tokenizer"].get(e) == simdjson::SUCCESS)
    read_pre_tokenizer(e, spec, byte_level, path);
  if (!byte_level)
    throw_error(ErrorCode::unsupported,
                "{}: not a byte-level BPE tokenizer (no ByteLevel pre-tokenizer)", path);

  spec.chat_template = read_chat_template(fs::path(path).parent_path(), parser);
  return spec;
}

TokenizerSpec read_vocab_merges(const std::string& dir_str) {
  fs::path dir(dir_str);
  TokenizerSpec spec;
  std::string vocab_path = (dir / "vocab.json").string();
  spec.source = vocab_path;
  simdjson::dom::parser parser;
  {
    std::string text = read_text_file(vocab_path);
    simdjson::dom::object vocab;
    if (parse_json(parser, text, vocab_path).get_object().get(vocab) != simdjson::SUCCESS)
      throw_error(ErrorCode::format, "{}: not a JSON object", vocab_path);
    for (auto [key, value] : vocab)
      spec.vocab.emplace_back(std::string(key), to_id(value, vocab_path, "an entry"));
  }
  {
    std::string merges_path = (dir / "merges.txt").string();
    std::string text = read_text_file(merges_path);
    std::size_t pos = 0, line_no = 0;
    while (pos < text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      std::string_view line(text.data() + pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
      auto sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        throw_error(ErrorCode::format, "{}:{}: a merge must be two tokens", merges_path, line_no);
      spec.merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
    }
  }
  // tokenizer_config.json names the tokenizer class (which decides the pattern and the
  // normalizer, as transformers' slow tokenizers do) and lists the added tokens.
  std::string tokenizer_class;
  fs::path config_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    std::string text = read_text_file(config_path.string());
    simdjson::dom::element config = parse_json(parser, text, config_path.string());
    std::string_view cls;
    if (config["tokenizer_class"].get_string().get(cls) == simdjson::SUCCESS) tokenizer_class = cls;
    simdjson::dom::object decoder;
    if (config["added_tokens_decoder"].get_object().get(decoder) == simdjson::SUCCESS) {
      for (auto [key, value] : decoder) {
        std::int32_t id = 0;
        try {
          id = static_cast<std::int32_t>(std::stol(std::string(key)));
        } catch (const std::exception&) {
          throw_error(ErrorCode::format, "{}: added token id '{}' is not a number",
                      config_path.string(), key);
        }
        spec.added.push_back(read_added_token(value, id, config_path.string()));
      }
    }
  }
  if (spec.added.empty()) {
    // GPT-2's files carry no config: <|endoftext|> is its one special token.
    for (const auto& [token, id] : spec.vocab) {
      if (token == "<|endoftext|>") {
        AddedToken t;
        t.content = token;
        t.id = id;
        t.special = true;
        spec.added.push_back(t);
      }
    }
  }
  if (tokenizer_class.starts_with("Qwen2")) {
    spec.patterns.emplace_back(qwen2_pattern);
    spec.normalization = NormalizationForm::nfc;
  } else {
    spec.patterns.emplace_back(gpt2_pattern);
  }
  spec.chat_template = read_chat_template(dir, parser);
  return spec;
}

}  // namespace xserv::tokenizer
