// Shared by the libFuzzer targets of tests/fuzz: inputs as files (the loaders take paths), the
// tokenizers the targets run on, and the rule for expected failures.
//
// A target calls the code under test and lets xserv::Error pass (that is the correct answer to
// a broken input); anything else escaping, a crash, a sanitizer report, a hang past libFuzzer's
// -timeout or memory past -rss_limit_mb is a finding.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv::fuzz {

// Runs fn(); an xserv::Error is an accepted outcome, everything else propagates (a crash).
template <typename Fn>
void expect_ok_or_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
  }
}

// A scratch directory made once per process (removed by the OS's tmp cleaning; libFuzzer
// processes exit without running destructors reliably).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/xserv-fuzz-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    return std::string(tmpl);
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
  return path;
}

// The real tokenizers the tests compare with Hugging Face: GPT-2 (the shipped example model's)
// and Qwen3 (shared/, with its chat template). Loaded once; the Qwen3 one may be missing on a
// checkout without shared/ (nullptr then).
inline const Tokenizer& gpt2_tokenizer() {
  static const Tokenizer tok =
      Tokenizer::load(XSERV_SOURCE_DIR "/examples/models/shakespeare/tokenizer.json");
  return tok;
}
inline const Tokenizer* qwen3_tokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    try {
      return new Tokenizer(Tokenizer::load(XSERV_SHARED_DIR "/tokenizers/qwen3"));
    } catch (const Error&) {
      return nullptr;
    }
  }();
  return tok;
}

// Loads both tokenizers: call it from LLVMFuzzerInitialize, where libFuzzer's per-input
// -timeout does not apply (building the Qwen3 tokenizer under ASan takes seconds).
inline void load_tokenizers() {
  (void)gpt2_tokenizer();
  (void)qwen3_tokenizer();
}

// Reads a little-endian u32 from data (zero-padded past the end) and advances.
inline std::uint32_t take_u32(const std::uint8_t*& data, std::size_t& size) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4 && size > 0; ++i, ++data, --size) v |= std::uint32_t{*data} << (8 * i);
  return v;
}

}  // namespace xserv::fuzz
