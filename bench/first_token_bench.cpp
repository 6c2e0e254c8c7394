// first_token_bench: what a host sees through the C API after xserv_model_load — load time,
// host memory after the load, and the time to the first token of prompts whose lengths the
// process has not seen before (then the same prompts again).
//
//   first_token_bench -m DIR [--device cpu|cuda] [--lengths 1,6,11,32,100]
//
// Each prompt is L random ids turned to text and back (so the C API's text path is used);
// time to first token = xserv_generate with max_tokens 1, greedy, from the call to the first
// token callback. Host memory is VmRSS / VmHWM of /proc/self/status after the load.
#include <xserv.h>

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
  Clock::time_point start, first;
  bool seen = false;
};

bool on_token(const xserv_token_event*, void* user) {
  auto* t = static_cast<Timing*>(user);
  if (!t->seen) t->first = Clock::now(), t->seen = true;
  return true;
}

int fail(const char* what) {
  std::fprintf(stderr, "first_token_bench: %s: %s\n", what, xserv_last_error());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, device = "auto";
  std::vector<int> lengths{1, 6, 11, 32, 100};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "-m") dir = v;
    else if (a == "--device") device = v;
    else if (a == "--lengths") {
      lengths.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) lengths.push_back(std::atoi(x.c_str()));
    } else {
      std::fprintf(stderr, "first_token_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: first_token_bench -m DIR [--device cpu|cuda] [--lengths 1,6,...]\n");
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
  xserv_model_free(model);
  return 0;
}
