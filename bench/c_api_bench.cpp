// c_api_bench: what a host sees through the C API after xserv_model_load — load time, host
// memory after the load, the time to the first token of prompts whose lengths the process has
// not seen before (then the same prompts again), and batch-1 decode speed greedy vs sampled.
//
//   c_api_bench -m DIR [--device cpu|cuda] [--lengths 1,6,11,32,100] [--decode N]
//
// Each prompt is L random ids turned to text and back (so the C API's text path is used);
// time to first token = xserv_generate with max_tokens 1, greedy, from the call to the first
// token callback. Host memory is VmRSS / VmHWM of /proc/self/status after the load. Decode:
// N tokens (default 128, 0 = skip) after a 32-token prompt, tok/s between the first and the last
// token callback, best of 3, for greedy, Qwen3's generation_config sampling (temperature 0.6,
// top-k 20, top-p 0.95), the same with top-k off, a plain draw at temperature 1 (the OpenAI
// API's defaults), and greedy with repetition_penalty 1.1.
#include <xserv.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

std::string proc_status(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return line.substr(std::strlen(key) + 1);
  return "?";
}

struct Timing {
  Clock::time_point start, first, last;
  bool seen = false;
  int tokens = 0;
};

bool on_token(const xserv_token_event*, void* user) {
  auto* t = static_cast<Timing*>(user);
  t->last = Clock::now();
  if (!t->seen) t->first = t->last, t->seen = true;
  ++t->tokens;
  return true;
}

int fail(const char* what) {
  std::fprintf(stderr, "c_api_bench: %s: %s\n", what, xserv_last_error());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, device = "auto";
  std::vector<int> lengths{1, 6, 11, 32, 100};
  int decode = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "-m") dir = v;
    else if (a == "--device") device = v;
    else if (a == "--decode") decode = std::atoi(v.c_str());
    else if (a == "--lengths") {
      lengths.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) lengths.push_back(std::atoi(x.c_str()));
    } else {
      std::fprintf(stderr, "c_api_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: c_api_bench -m DIR [--device cpu|cuda] [--lengths 1,6,...]\n");
    return 2;
  }
  xserv_model_params mp = xserv_model_default_params();
  mp.device = device == "cpu" ? XSERV_DEVICE_CPU : device == "cuda" ? XSERV_DEVICE_CUDA : XSERV_DEVICE_AUTO;
  xserv_model* model = nullptr;
  const auto t0 = Clock::now();
  if (xserv_model_load(dir.c_str(), &mp, &model) != XSERV_OK) return fail("load");
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("model: %s\nload: %.2f s, host RSS after load %s (peak %s)\n", xserv_model_desc(model),
              load_s, proc_status("VmRSS").c_str(), proc_status("VmHWM").c_str());

  // Distinct prompts: ids from a fixed range of ordinary tokens, different per length.
  std::vector<std::string> prompts;
  for (int len : lengths) {
    std::vector<int32_t> ids(static_cast<std::size_t>(len));
    for (int i = 0; i < len; ++i) ids[static_cast<std::size_t>(i)] = 1000 + (i * 37 + len * 101) % 5000;
    size_t n = 0;
    xserv_detokenize(model, ids.data(), ids.size(), true, nullptr, 0, &n);
    std::string text(n + 1, '\0');
    if (xserv_detokenize(model, ids.data(), ids.size(), true, text.data(), text.size(), &n) != XSERV_OK)
      return fail("detokenize");
    text.resize(n);
    prompts.push_back(text);
  }
  xserv_generate_params gp = xserv_generate_default_params();
  gp.max_tokens = 1;
  gp.temperature = 0;
  gp.ignore_eos = true;
  std::printf("%8s %8s %14s %14s\n", "length", "tokens", "first (ms)", "again (ms)");
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    double ms[2] = {0, 0};
    for (int pass = 0; pass < 2; ++pass) {
      Timing t;
      t.start = Clock::now();
      if (xserv_generate(model, prompts[i].c_str(), &gp, on_token, &t, nullptr) != XSERV_OK)
        return fail("generate");
      ms[pass] = std::chrono::duration<double, std::milli>(t.first - t.start).count();
    }
    size_t n = 0;
    xserv_tokenize(model, prompts[i].c_str(), false, nullptr, 0, &n);
    std::printf("%8d %8zu %14.2f %14.2f\n", lengths[i], n, ms[0], ms[1]);
  }

  if (decode > 0) {
    struct Mode {
      const char* name;
      float temperature;
      int top_k;
      float top_p, repetition_penalty;
    };
    const Mode modes[] = {{"greedy", 0, 0, 1, 1},
                          {"t0.6 top-k 20 top-p 0.95", 0.6f, 20, 0.95f, 1},
                          {"t0.6 top-p 0.95 (no top-k)", 0.6f, 0, 0.95f, 1},
                          {"t1.0, no filter (OpenAI's)", 1.0f, 0, 1.0f, 1},
                          {"greedy, repetition 1.1", 0, 0, 1, 1.1f}};
    std::printf("\ndecode, batch 1, %d tokens after a 32-token prompt\n%-28s %10s %8s\n", decode, "sampling",
                "tok/s", "x greedy");
    double greedy = 0;
    for (const Mode& m : modes) {
      xserv_generate_params dp = xserv_generate_default_params();
      dp.max_tokens = decode;
      dp.ignore_eos = true;
      dp.temperature = m.temperature;
      dp.top_k = m.top_k;
      dp.top_p = m.top_p;
      dp.repetition_penalty = m.repetition_penalty;
      dp.seed = 1;
      double best = 0;
      for (int rep = 0; rep < 3; ++rep) {
        Timing t;
        if (xserv_generate(model, prompts[std::min<std::size_t>(3, prompts.size() - 1)].c_str(), &dp, on_token, &t,
                           nullptr) != XSERV_OK)
          return fail("generate");
        const double s = std::chrono::duration<double>(t.last - t.first).count();
        if (t.tokens > 1 && s > 0) best = std::max(best, (t.tokens - 1) / s);
      }
      if (greedy == 0) greedy = best;
      std::printf("%-28s %10.1f %8.2f\n", m.name, best, best / greedy);
    }
  }
  xserv_model_free(model);
  return 0;
}
