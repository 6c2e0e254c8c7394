#include "tokenizer/regex_splitter.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>

#include "core/error.hpp"

namespace xserv::tokenizer {

namespace {

// Unicode White_Space (what Oniguruma's \s matches with Unicode strings).
constexpr std::string_view white_space_set =
    R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

std::string rewrite_spaces(std::string_view p) {
  std::string out;
  out.reserve(p.size() * 2);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += white_space_set;
        } else {
          out += '[';
          out += white_space_set;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += white_space_set;
        out += ']';
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

constexpr std::uint32_t kMatchLimit = 10'000'000;

// A match context with a JIT stack per thread: the default 32 KiB stack is too small for
// \s+(?!\S) over long whitespace runs.
struct ThreadMatchState {
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_data* data = nullptr;
  ThreadMatchState() {
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(std::size_t{32} << 10, std::size_t{16} << 20, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
    // PCRE2's default budget, stated: about 0.1 s of backtracking per match attempt.
    if (context) pcre2_set_match_limit(context, kMatchLimit);
    data = pcre2_match_data_create(1, nullptr);
    if (!context || !data)
      throw Error(ErrorCode::out_of_memory, "tokenizer: cannot allocate PCRE2 match state");
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;
};

// A pattern that backtracks without end (a tokenizer.json with "(a+)+$") stops at PCRE2's
// limits instead of running for hours: Error(resource_exhausted), which the C API documents for
// xserv_tokenize. Any other failure is a bug here (Error(internal)).
[[noreturn]] void throw_match_error(int rc, std::size_t offset) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof msg);
  const bool limit = rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                     rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT ||
                     rc == PCRE2_ERROR_NOMEMORY;
  throw_error(limit ? ErrorCode::resource_exhausted : ErrorCode::internal,
              "tokenizer: the pre-tokenizer pattern {} at byte {} of the text: {}",
              limit ? "exceeded its matching budget" : "failed", offset,
              reinterpret_cast<const char*>(msg));
}

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

RegexSplitter::RegexSplitter(std::string_view pattern) : pattern_(rewrite_spaces(pattern)) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw_error(ErrorCode::format,
                "tokenizer: pre-tokenizer pattern does not compile at offset {}: {} ({})", offset,
                reinterpret_cast<const char*>(msg), std::string(pattern));
  }
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  code_ = std::move(code);
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  ThreadMatchState& st = thread_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t pos = 0;      // where the next search starts
  std::size_t emitted = 0;  // end of the last piece appended
  while (pos < text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), pos,
                                          PCRE2_NO_UTF_CHECK, st.data, st.context)
                        : pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                      st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw_match_error(rc, pos);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    std::size_t start = ov[0], end = ov[1];
    if (end == start) {
      // An empty match splits nothing; step over one character.
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > emitted) out.push_back(text.substr(emitted, start - emitted));
    out.push_back(text.substr(start, end - start));
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back(text.substr(emitted));
}

}  // namespace xserv::tokenizer
