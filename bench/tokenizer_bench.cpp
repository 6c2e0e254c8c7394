// Encode throughput of xserv::Tokenizer (GPT-2 and Qwen3) on English prose (tinyshakespeare),
// code (xserv's own sources) and CJK (sentences of Qwen3 vocabulary words), in MB/s of UTF-8
// input, single-threaded, with the word cache warm (as in a long-running process).
//
// bench/tokenizer_hf_bench.py measures Hugging Face tokenizers on the same inputs: run
//   tokenizer_bench --xserv_dump_inputs=DIR   (writes english.txt, code.txt, cjk.txt and exits)
//   python3 bench/tokenizer_hf_bench.py --inputs DIR --tokenizers TOKENIZERS_DIR
// Paths: $XSERV_TOKENIZERS (default <shared>/tokenizers) and $XSERV_BENCH_TEXT (default
// <shared>/data/tinyshakespeare.txt).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string tokenizers_dir() {
  return env_or("XSERV_TOKENIZERS", XSERV_SHARED_DIR "/tokenizers");
}

std::string english() {
  std::string text =
      read_file(env_or("XSERV_BENCH_TEXT", XSERV_SHARED_DIR "/data/tinyshakespeare.txt"));
  if (text.empty())
    throw std::runtime_error("tinyshakespeare.txt not found (set XSERV_BENCH_TEXT)");
  return text;
}

// xserv's C++ sources, in path order, up to 1 MB.
std::string code() {
  std::vector<fs::path> files;
  for (const char* dir : {"lib", "examples", "tests", "bench"}) {
    fs::path root = fs::path(XSERV_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      auto ext = e.path().extension();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".hpp" || ext == ".cu" || ext == ".cuh"))
        files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::string text;
  for (const auto& f : files) {
    text += read_file(f);
    if (text.size() >= 1000000) break;
  }
  return text.substr(0, std::min<std::size_t>(text.size(), 1000000));
}

// About 1 MB of Chinese: "sentences" of 4..15 vocabulary words made only of CJK ideographs
// (low ids, i.e. frequent words, drawn more often), ended by ，or 。, a newline every few.
std::string cjk(const xserv::Tokenizer& qwen) {
  std::vector<std::string> words;
  for (std::int32_t id = 0; id < qwen.vocab_size(); ++id) {
    std::string_view b = qwen.token_bytes(id);
    if (b.size() < 3 || b.size() % 3 != 0) continue;
    bool all = true;
    for (std::size_t i = 0; i < b.size() && all; i += 3) {
      auto c0 = static_cast<unsigned char>(b[i]);
      all = c0 >= 0xE4 && c0 <= 0xE9;  // U+4E00..U+9FFF lead bytes
    }
    if (all) words.emplace_back(b);
  }
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / 9007199254740992.0;
  };
  std::string text;
  int sentence = 0;
  while (text.size() < 1000000) {
    int n = 4 + static_cast<int>(next() * 12);
    for (int i = 0; i < n; ++i) {
      double u = next();
      text += words[static_cast<std::size_t>(u * u * static_cast<double>(words.size()))];
    }
    text += (++sentence % 3 == 0) ? "。" : "，";
    if (sentence % 7 == 0) text += "\n";
  }
  return text;
}

struct Inputs {
  std::map<std::string, std::unique_ptr<xserv::Tokenizer>> tokenizers;
  std::map<std::string, std::string> texts;
};

Inputs& inputs() {
  static Inputs in = [] {
    Inputs r;
    for (const char* name : {"gpt2", "qwen3"})
      r.tokenizers[name] =
          std::make_unique<xserv::Tokenizer>(xserv::Tokenizer::load(tokenizers_dir() + "/" + name));
    r.texts["english"] = english();
    r.texts["code"] = code();
    r.texts["cjk"] = cjk(*r.tokenizers["qwen3"]);
    return r;
  }();
  return in;
}

void encode(benchmark::State& state, const std::string& tok_name, const std::string& text_name) {
  const auto& tok = *inputs().tokenizers.at(tok_name);
  const std::string& text = inputs().texts.at(text_name);
  std::size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["MB_per_s"] = benchmark::Counter(
      static_cast<double>(text.size()) / 1e6 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

// Documents of about 4 KB: whole lines joined until a chunk reaches 4096 bytes (the same split as
// tokenizer_hf_bench.py), encoded one call each: how a server sees text, and a fairer comparison
// with HF, whose per-call offset tracking makes one 1 MB call much slower than many small ones.
std::vector<std::string_view> chunks(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = start;
    while (end < text.size() && end - start < 4096) {
      std::size_t nl = text.find('\n', end);
      end = nl == std::string_view::npos ? text.size() : nl + 1;
    }
    out.push_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

void encode_chunks(benchmark::State& state, const std::string& tok_name,
                   const std::string& text_name) {
  const auto& tok = *inputs().tokenizers.at(tok_name);
  const std::string& text = inputs().texts.at(text_name);
  const auto docs = chunks(text);
  std::size_t tokens = 0;
  for (auto _ : state) {
    tokens = 0;
    for (auto doc : docs) {
      auto ids = tok.encode(doc);
      tokens += ids.size();
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["MB_per_s"] = benchmark::Counter(
      static_cast<double>(text.size()) / 1e6 * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

void load(benchmark::State& state, const std::string& tok_name) {
  for (auto _ : state)
    benchmark::DoNotOptimize(xserv::Tokenizer::load(tokenizers_dir() + "/" + tok_name));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    constexpr const char* dump_flag = "--xserv_dump_inputs=";
    if (std::strncmp(argv[i], dump_flag, std::strlen(dump_flag)) == 0) {
      fs::path dir(argv[i] + std::strlen(dump_flag));
      fs::create_directories(dir);
      for (const auto& [name, text] : inputs().texts)
        std::ofstream(dir / (name + ".txt"), std::ios::binary) << text;
      return 0;
    }
  }
  for (const char* tok : {"gpt2", "qwen3"}) {
    for (const char* text : {"english", "code", "cjk"})
      benchmark::RegisterBenchmark((std::string("encode/") + tok + "/" + text).c_str(),
                                   [=](benchmark::State& s) { encode(s, tok, text); })
          ->Unit(benchmark::kMillisecond);
    for (const char* text : {"english", "code", "cjk"})
      benchmark::RegisterBenchmark((std::string("encode_chunks/") + tok + "/" + text).c_str(),
                                   [=](benchmark::State& s) { encode_chunks(s, tok, text); })
          ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("load/") + tok).c_str(), [=](benchmark::State& s) {
      load(s, tok);
    })->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
