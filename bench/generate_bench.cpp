// generate_bench: prefill and decode speed of the whole generation path (Model::forward on a
// backend, backend sampling, the engine's host loop), printed as a table.
//
//   generate_bench (-m DIR | --dummy-weights --config FILE.json) [--device cpu|cuda]
//                  [--batch B[,B...]] [--prompt-len P] [--gen-len G] [--threads N] [--repeat R]
//                  [--profile] [--tp N]
//
// --tp N splits the model over N ranks (tensor parallelism: GPUs 0 .. N-1, docs/parallel.md).
//
// For each batch size: B random prompts of P tokens are prefilled (packed into forwards of up
// to max(512, B x P) tokens), then G tokens are generated greedily per sequence (eos ignored).
// prefill tok/s = prompt tokens / time of the steps that held prompt tokens (they include the
// first sampling); decode tok/s = tokens / time of the pure decode steps (each step = one
// forward of B tokens + sampling). The best of R runs is kept (after one warm-up run).
// --profile: after the runs, one more run whose prefill and decode steps are broken down per op
// (TimedBackend: wall time of each backend call) next to the engine's host time per step.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "bench_args.hpp"
#include "core/error.hpp"
#include "engine/generate.hpp"
#include "models/model.hpp"
#include "timed_backend.hpp"

using namespace xserv;
using bench::number;

namespace {

struct Options {
  std::string model, config, device;
  bool dummy = false;
  std::vector<std::int32_t> batches{1};
  std::int32_t prompt_len = 128, gen_len = 32, repeat = 3;
  std::size_t threads = 0;
  bool profile = false;
  int tp = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      XSERV_CHECK(i + 1 < argc, ErrorCode::invalid_argument, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "-m" || a == "--model") o.model = value();
    else if (a == "--config") o.config = value();
    else if (a == "--dummy-weights") o.dummy = true;
    else if (a == "--profile") o.profile = true;
    else if (a == "--device") o.device = value();
    else if (a == "--prompt-len") o.prompt_len = number<std::int32_t>(value());
    else if (a == "--gen-len") o.gen_len = number<std::int32_t>(value());
    else if (a == "--threads") o.threads = number<std::size_t>(value());
    else if (a == "--repeat") o.repeat = number<std::int32_t>(value());
    else if (a == "--tp") o.tp = number<int>(value());
    else if (a == "--batch") {
      o.batches = bench::number_list(value());
    } else {
      throw_error(ErrorCode::invalid_argument, "unknown option '{}'", a);
    }
  }
  XSERV_CHECK(!o.model.empty() || (o.dummy && !o.config.empty()), ErrorCode::invalid_argument,
              "give -m DIR, or --dummy-weights --config FILE.json");
  XSERV_CHECK(o.prompt_len > 0 && o.gen_len > 1 && o.repeat > 0, ErrorCode::invalid_argument,
              "--prompt-len >= 1, --gen-len >= 2 and --repeat >= 1 please");
  return o;
}

// One more run of `reqs`: the per-op time of its prefill (the ops before the first token, all
// prompt tokens together) and of its decode steps (timing restarts at the first token), and the
// engine's host time per decode step.
void profile(Engine& engine, const std::vector<GenerationRequest>& reqs, bench::TimedBackend& timed) {
  bool started = false;
  EngineStats at_start;
  std::map<std::string, bench::TimedBackend::Entry> prefill_ops;
  timed.reset();
  auto on_token = [&](const TokenEvent&) {
    if (!started) {
      started = true;
      prefill_ops = timed.entries();
      timed.reset();
      at_start = engine.stats();
    }
    return true;
  };
  GenerationStats s;
  generate(engine, reqs, on_token, &s);
  const EngineStats end = engine.stats();
  std::printf("\nprofile of the prefill (%lld prompt tokens, %.1f us):\n",
              static_cast<long long>(s.prefill_tokens), 1e6 * s.prefill_seconds);
  bench::TimedBackend::print(prefill_ops, 1.0);
  const auto steps = static_cast<double>(s.decode_tokens) / static_cast<double>(reqs.size());
  std::printf("\nprofile of the decode steps (batch %zu, %.0f steps, %.1f us per step; engine host "
              "work %.1f us, forward %.1f us per step):\n",
              reqs.size(), steps, 1e6 * s.decode_seconds / steps,
              1e6 * (end.host_seconds - at_start.host_seconds) / steps,
              1e6 * (end.forward_seconds - at_start.forward_seconds) / steps);
  timed.print(steps);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) try {
  Options o = parse(argc, argv);
  const bench::ModelDir model_dir(o.model, o.config, "bench");  // a lone config: dummy weights
  const std::string& dir = model_dir.path();
  bench::TimedBackend* timed = nullptr;
  ParallelOptions po = bench::parallel_options(o.device, o.tp, o.threads);
  if (o.profile) {  // rank 0's ops timed
    po.wrap_backend = [&timed](std::unique_ptr<Backend> inner, int rank) -> std::unique_ptr<Backend> {
      if (rank != 0) return inner;
      auto t = std::make_unique<bench::TimedBackend>(std::move(inner));
      timed = t.get();
      return t;
    };
  }
  const std::int32_t max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  ModelOptions mo;
  mo.dummy_weights = o.dummy;
  mo.max_batch_tokens = std::max(512, std::min(max_batch * o.prompt_len, 8192));
  // Load time: Model::load until every weight is resident (the CUDA backend copies asynchronously).
  const auto load_start = std::chrono::steady_clock::now();
  auto group = ModelGroup::load(dir, po, mo);
  group->run([&](int r) { group->backend(r).synchronize(); });
  Model* model = &group->leader();
  Backend* backend = &model->backend();
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const ModelConfig& c = model->config();
  XSERV_CHECK(o.prompt_len + o.gen_len <= c.max_position_embeddings, ErrorCode::invalid_argument,
              "prompt + gen = {} exceeds the context of {}", o.prompt_len + o.gen_len,
              c.max_position_embeddings);
  // Room for the largest batch's whole runs; no prefix cache (the repeats reuse the prompts).
  EngineOptions eo;
  eo.max_seqs = max_batch;
  eo.kv_cache_tokens = static_cast<std::int64_t>(max_batch) * (o.prompt_len + o.gen_len + eo.block_size);
  eo.prefix_cache = false;
  Engine engine(*group, nullptr, eo);

  std::printf("model: %s (%s, %d layers, hidden %d, vocab %d, %s weights%s, %.1f MB)\n",
              o.model.empty() ? o.config.c_str() : o.model.c_str(), c.model_type.c_str(),
              c.num_layers, c.hidden_size, c.vocab_size,
              std::string(dtype_name(model->weight_dtype())).c_str(), o.dummy ? ", dummy" : "",
              static_cast<double>(model->weight_bytes()) / 1e6);
  if (o.tp > 1) std::printf("tensor parallel: %d ranks (weights per rank: rank 0 %.1f MB)\n", o.tp,
                           static_cast<double>(model->weight_bytes()) / 1e6);
  std::printf("backend: %s; load %.2f s; prompt %d tokens, %d generated per sequence, best of %d runs\n\n",
              backend->name().c_str(), load_seconds, o.prompt_len, o.gen_len, o.repeat);
  std::printf("| batch | prefill tok/s | decode tok/s | decode ms/step |\n");
  std::printf("| ---: | ---: | ---: | ---: |\n");

  std::uint64_t state = 42;
  for (std::int32_t b : o.batches) {
    std::vector<GenerationRequest> reqs(static_cast<std::size_t>(b));
    for (auto& r : reqs) {
      for (std::int32_t i = 0; i < o.prompt_len; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        r.prompt.push_back(static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(c.vocab_size)));
      }
      r.params.temperature = 0.0f;
      r.params.ignore_eos = true;
      r.params.max_tokens = o.gen_len;
    }
    generate(engine, reqs);  // warm-up: caches, page faults, graph recordings
    double best_prefill = 0, best_decode = 0, best_step = 0;
    for (std::int32_t rep = 0; rep < o.repeat; ++rep) {
      GenerationStats s;
      generate(engine, reqs, {}, &s);
      const double prefill = static_cast<double>(s.prefill_tokens) / s.prefill_seconds;
      const double decode = static_cast<double>(s.decode_tokens) / s.decode_seconds;
      const auto decode_steps = static_cast<double>(s.decode_tokens) / b;
      best_prefill = std::max(best_prefill, prefill);
      if (decode > best_decode) {
        best_decode = decode;
        best_step = 1e3 * s.decode_seconds / decode_steps;
      }
    }
    std::printf("| %d | %.1f | %.1f | %.2f |\n", b, best_prefill, best_decode, best_step);
    std::fflush(stdout);
    if (timed) profile(engine, reqs, *timed);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "generate_bench: %s\n", e.what());
  return 1;
}
