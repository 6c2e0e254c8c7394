// xserv-cli tokenize / detokenize: text <-> ids on stdin/stdout, for scripts and for checking
// xserv's tokenizer against others from outside.
//
//   xserv-cli tokenize -m PATH [--jsonl] [--no-special]
//     reads stdin; prints the ids of all of it as one JSON array. With --jsonl every input line
//     is a JSON string and every output line the JSON array of its ids.
//   xserv-cli detokenize -m PATH [--skip-special]
//     every input line is a JSON array of ids; every output line the JSON string they decode to.
// PATH is a model directory or a tokenizer.json. In the line modes every line's result is
// written (and flushed) as soon as the line is read, so they work as a pipe filter. Bad input
// (invalid UTF-8, a line that is not the expected JSON) stops with a message naming the line and
// exit code 1, after the results of the lines before it. Blank lines are skipped.
#include <simdjson.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "checks.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv::cli {

// Named (not only anonymous) so the command files can share one translation unit (unity builds).
namespace tokenize_cmd {
namespace {

struct Options {
  std::string model;
  bool jsonl = false;
  bool no_special = false;
  bool skip_special = false;
  bool help = false;
};

Options parse_options(const Args& args, const char* command) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if ((a == "-m" || a == "--model") && i + 1 < args.size()) {
      o.model = args[++i];
    } else if (a == "--jsonl") {
      o.jsonl = true;
    } else if (a == "--no-special") {
      o.no_special = true;
    } else if (a == "--skip-special") {
      o.skip_special = true;
    } else if (a == "-h" || a == "--help") {
      o.help = true;
    } else {
      throw_error(ErrorCode::invalid_argument, "unknown option '{}' (see xserv-cli {} --help)", a,
                  command);
    }
  }
  if (o.help) return o;
  if (o.model.empty())
    throw_error(ErrorCode::invalid_argument,
                "-m PATH (model directory or tokenizer.json) is required");
  check_model_path(o.model, ModelPath::directory_or_tokenizer_file);
  return o;
}

void print_ids(const std::vector<std::int32_t>& ids, std::string& out) {
  out += '[';
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
}

void append_json_string(std::string_view s, std::string& out) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20 || u == 0x7F) {
          out += "\\u00";
          out += hex[u >> 4];
          out += hex[u & 15];
        } else {
          out += c;
        }
    }
  }
  out += "\"\n";
}

// Calls fn(line, line_number) for every non-blank line of stdin ("\r\n" endings accepted).
template <typename F>
void for_each_line(F&& fn) {
  std::string line;
  std::size_t number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    fn(line, number);
  }
}

void flush(std::string& out) {
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  out.clear();
}

}  // namespace
}  // namespace tokenize_cmd

int run_tokenize(const Args& args) {
  using namespace tokenize_cmd;
  Options o = parse_options(args, "tokenize");
  if (o.help) {
    std::printf(
        "usage: xserv-cli tokenize -m PATH [--jsonl] [--no-special]\n"
        "  reads stdin and prints its token ids as a JSON array\n"
        "  --jsonl       each input line is a JSON string; one JSON array per line out\n"
        "  --no-special  encode special tokens (<|im_start|>, ...) as plain text\n");
    return 0;
  }
  Tokenizer tok = Tokenizer::load(o.model);
  std::string out;
  if (!o.jsonl) {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    print_ids(tok.encode(text, !o.no_special), out);
    flush(out);
    return 0;
  }
  simdjson::dom::parser parser;
  for_each_line([&](const std::string& line, std::size_t number) {
    std::string_view text;
    if (parser.parse(line).get_string().get(text) != simdjson::SUCCESS)
      throw_error(ErrorCode::invalid_argument, "line {}: not a JSON string", number);
    try {
      print_ids(tok.encode(text, !o.no_special), out);
    } catch (const Error& e) {
      throw_error(e.code(), "line {}: {}", number, e.what());
    }
    flush(out);  // each line's result as soon as it is read (a later bad line stops the rest)
  });
  flush(out);
  return 0;
}

int run_detokenize(const Args& args) {
  using namespace tokenize_cmd;
  Options o = parse_options(args, "detokenize");
  if (o.help) {
    std::printf(
        "usage: xserv-cli detokenize -m PATH [--skip-special]\n"
        "  each input line is a JSON array of ids; prints one JSON string per line\n"
        "  --skip-special  drop special tokens\n");
    return 0;
  }
  Tokenizer tok = Tokenizer::load(o.model);
  std::string out;
  simdjson::dom::parser parser;
  std::vector<std::int32_t> ids;
  for_each_line([&](const std::string& line, std::size_t number) {
    simdjson::dom::array array;
    if (parser.parse(line).get_array().get(array) != simdjson::SUCCESS)
      throw_error(ErrorCode::invalid_argument, "line {}: not a JSON array", number);
    ids.clear();
    for (auto v : array) {
      std::int64_t id = 0;
      if (v.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id >= tok.vocab_size())
        throw_error(ErrorCode::invalid_argument, "line {}: ids must be integers in [0, {})", number,
                    tok.vocab_size());
      ids.push_back(static_cast<std::int32_t>(id));
    }
    append_json_string(tok.decode(ids, o.skip_special), out);
    flush(out);  // each line's result as soon as it is read (a later bad line stops the rest)
  });
  flush(out);
  return 0;
}

}  // namespace xserv::cli
