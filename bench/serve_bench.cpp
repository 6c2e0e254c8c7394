// serve_bench: serving throughput and latency through the Engine (continuous batching), as a
// server sees it: requests arrive, run batched with whatever else runs, and stream tokens.
//
//   serve_bench (-m DIR | --dummy-weights --config FILE.json) [--device cpu|cuda]
//               [--concurrency N[,N...]] [--poisson RATE --requests N]
//               [--prompt-len 128] [--gen-len 128] [--shared-prefix 1024 --requests 256]
//               [--max-batch-tokens T] [--max-prefill-tokens P] [--kv-cache-tokens K]
//               [--gpu-memory-fraction F] [--tp N]
//
// --tp N splits the model over N ranks (tensor parallelism: GPUs 0 .. N-1, docs/parallel.md).
// --max-batch-tokens (tokens a step, prompt chunks and decodes; the model's workspace is sized
// for it) defaults to 16384: 128 requests of 128 tokens at once prefill in one step instead of
// nine 2048-token chunks and end together instead of in groups over the last steps (H200,
// Qwen3-1.7B 128 at once +6.5%, 64 +4.4%, Qwen3-8B 128 +5.2% against 2048; docs/benchmarks.md,
// issue 10, "Where a serving run's time goes").
//
// Workloads (random prompt ids, greedy, eos ignored, so every request runs gen-len tokens):
// - all at once: for each N of --concurrency, N requests submitted before the first step;
// - --poisson RATE: --requests requests arriving at RATE per second (exponential gaps);
// - --shared-prefix P: --requests requests of a common P-token prefix plus a 64-token
//   question, 64 out, run with the prefix cache on and then off (the hit rate is printed).
// Reported: output tok/s (generated tokens / wall time from first submit to last token), TTFT
// (submit to first token) and inter-token latency (gaps between a request's tokens), p50/p99,
// and the engine's step time split into host work (schedule, batch building, outputs, event
// callbacks) and the forward (upload, model, sampling, the wait for the ids), per step; on
// stderr, each workload's wall time next to the forward time of its decode-only steps (and their
// mean) and of the steps that carried prefill chunks.
// The engine is stepped from this thread; timestamps are taken in the event callbacks.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "bench_args.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "models/model.hpp"

using namespace xserv;
using bench::number;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::string model, config, device;
  bool dummy = false;
  std::vector<std::int32_t> concurrency{16, 64, 128};
  double poisson_rate = 0;
  std::int32_t requests = 0;
  std::int32_t prompt_len = 128, gen_len = 128, shared_prefix = 0;
  std::int32_t max_batch_tokens = 0, max_prefill_tokens = 0;
  std::int64_t kv_cache_tokens = 0;
  float gpu_memory_fraction = 0.9f;
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
    if (a == "--tp") o.tp = number<int>(value());
    else if (a == "-m" || a == "--model") o.model = value();
    else if (a == "--config") o.config = value();
    else if (a == "--dummy-weights") o.dummy = true;
    else if (a == "--device") o.device = value();
    else if (a == "--prompt-len") o.prompt_len = number<std::int32_t>(value());
    else if (a == "--gen-len") o.gen_len = number<std::int32_t>(value());
    else if (a == "--requests") o.requests = number<std::int32_t>(value());
    else if (a == "--shared-prefix") o.shared_prefix = number<std::int32_t>(value());
    else if (a == "--max-batch-tokens") o.max_batch_tokens = number<std::int32_t>(value());
    else if (a == "--max-prefill-tokens") o.max_prefill_tokens = number<std::int32_t>(value());
    else if (a == "--kv-cache-tokens") o.kv_cache_tokens = number<std::int64_t>(value());
    else if (a == "--gpu-memory-fraction") o.gpu_memory_fraction = std::stof(value());
    else if (a == "--poisson") o.poisson_rate = std::stod(value());
    else if (a == "--concurrency") {
      o.concurrency = bench::number_list(value());
    } else {
      throw_error(ErrorCode::invalid_argument, "unknown option '{}'", a);
    }
  }
  XSERV_CHECK(!o.model.empty() || (o.dummy && !o.config.empty()), ErrorCode::invalid_argument,
              "give -m DIR, or --dummy-weights --config FILE.json");
  XSERV_CHECK(o.prompt_len > 0 && o.gen_len > 0, ErrorCode::invalid_argument,
              "--prompt-len and --gen-len must be positive");
  return o;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto at = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(at, v.size() - 1)];
}

struct Arrival {
  double at = 0;  // seconds after the start
  std::vector<std::int32_t> prompt;
  std::int32_t gen_len = 0;
};

struct Result {
  double seconds = 0, tok_s = 0;
  double ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0;
  EngineStats stats;
};

// Submits each arrival at its time and steps until everything ended.
Result run(Engine& engine, const std::vector<Arrival>& arrivals) {
  struct Track {
    Clock::time_point submitted, last;
    bool first = true;
  };
  std::vector<Track> track(arrivals.size());
  std::vector<double> ttft, itl;
  std::uint64_t generated = 0;
  std::size_t open = arrivals.size(), next = 0;
  const EngineStats before = engine.stats();
  const auto start = Clock::now();
  Clock::time_point end = start;
  while (open > 0) {
    const double now = std::chrono::duration<double>(Clock::now() - start).count();
    for (; next < arrivals.size() && arrivals[next].at <= now; ++next) {
      EngineRequest r;
      r.prompt = arrivals[next].prompt;
      r.params.temperature = 0.0f;
      r.params.ignore_eos = true;
      r.params.max_tokens = arrivals[next].gen_len;
      const std::size_t i = next;
      r.on_event = [&, i](const EngineEvent& e) {
        const auto t = Clock::now();
        Track& k = track[i];
        if (e.type == EventType::token) {
          ++generated;
          if (k.first) ttft.push_back(std::chrono::duration<double>(t - k.submitted).count());
          else itl.push_back(std::chrono::duration<double>(t - k.last).count());
          k.first = false;
          k.last = t;
        }
        if (e.finish != FinishReason::none) {
          --open;
          end = t;
          XSERV_CHECK(e.status == ErrorCode::ok, e.status, "request failed: {}", e.error);
        }
      };
      track[i].submitted = Clock::now();
      engine.submit(std::move(r));
    }
    if (engine.has_work()) engine.step();
  }
  Result res;
  res.seconds = std::chrono::duration<double>(end - start).count();
  res.tok_s = static_cast<double>(generated) / res.seconds;
  res.ttft_p50 = 1e3 * percentile(ttft, 0.5);
  res.ttft_p99 = 1e3 * percentile(ttft, 0.99);
  res.itl_p50 = 1e3 * percentile(itl, 0.5);
  res.itl_p99 = 1e3 * percentile(itl, 0.99);
  res.stats = engine.stats();
  res.stats.prefix_queries -= before.prefix_queries;
  res.stats.prefix_hits -= before.prefix_hits;
  res.stats.preemptions -= before.preemptions;
  res.stats.steps -= before.steps;
  res.stats.host_seconds -= before.host_seconds;
  res.stats.forward_seconds -= before.forward_seconds;
  res.stats.decode_steps -= before.decode_steps;
  res.stats.decode_forward_seconds -= before.decode_forward_seconds;
  return res;
}

std::vector<std::int32_t> random_ids(std::mt19937_64& rng, std::int32_t n, std::int32_t vocab) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  return ids;
}

// Page faults of a fresh KV pool, graph recordings: a few short requests before timing.
void warm_up(Engine& engine, std::mt19937_64& rng, std::int32_t prompt_len, std::int32_t vocab) {
  std::vector<Arrival> warm(4);
  for (auto& a : warm) {
    a.prompt = random_ids(rng, prompt_len, vocab);
    a.gen_len = 8;
  }
  run(engine, warm);
}

void print(const char* workload, const Result& r) {
  const double steps = r.stats.steps > 0 ? static_cast<double>(r.stats.steps) : 1.0;
  std::printf("| %s | %.0f | %.1f / %.1f | %.2f / %.2f | %.2f | %llu | %.2f / %.2f |\n", workload,
              r.tok_s, r.ttft_p50, r.ttft_p99, r.itl_p50, r.itl_p99, r.stats.prefix_hit_rate(),
              static_cast<unsigned long long>(r.stats.preemptions),
              1e3 * r.stats.host_seconds / steps, 1e3 * r.stats.forward_seconds / steps);
  // Where the wall time went: the decode-only steps' forwards against the rest (the steps with
  // prefill chunks, host work).
  const auto decode_steps = static_cast<double>(r.stats.decode_steps);
  std::fprintf(stderr,
               "  %s: %.3f s wall, %llu steps, %llu decode-only (%.3f s of forward, %.2f ms each), "
               "the rest %.3f s of forward\n",
               workload, r.seconds, static_cast<unsigned long long>(r.stats.steps),
               static_cast<unsigned long long>(r.stats.decode_steps),
               r.stats.decode_forward_seconds,
               decode_steps > 0 ? 1e3 * r.stats.decode_forward_seconds / decode_steps : 0.0,
               r.stats.forward_seconds - r.stats.decode_forward_seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const bench::ModelDir model_dir(o.model, o.config, "serve-bench");  // a lone config: dummy weights
  const std::string& dir = model_dir.path();
  ModelOptions mo;
  mo.dummy_weights = o.dummy;
  mo.max_batch_tokens = o.max_batch_tokens > 0 ? o.max_batch_tokens : 16384;
  auto group = ModelGroup::load(dir, bench::parallel_options(o.device, o.tp, 0), mo);
  Model* model = &group->leader();
  Backend* backend = &model->backend();
  const std::int32_t vocab = model->config().vocab_size;

  EngineOptions eo;
  eo.kv_cache_tokens = o.kv_cache_tokens;
  eo.max_prefill_tokens = o.max_prefill_tokens;
  eo.gpu_memory_fraction = o.gpu_memory_fraction;
  std::printf("model: %s on %s%s, max_batch_tokens %d\n\n",
              o.model.empty() ? o.config.c_str() : o.model.c_str(), backend->name().c_str(),
              o.tp > 1 ? fmt::format(" (tensor parallel over {} ranks)", o.tp).c_str() : "",
              model->max_batch_tokens());
  std::printf("| workload | output tok/s | TTFT p50 / p99 ms | inter-token p50 / p99 ms | prefix hit rate | preemptions | host / forward ms per step |\n");
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::mt19937_64 rng(42);

  if (o.shared_prefix > 0) {
    const std::int32_t n = o.requests > 0 ? o.requests : 256;
    const auto prefix = random_ids(rng, o.shared_prefix, vocab);
    std::vector<Arrival> arrivals(static_cast<std::size_t>(n));
    for (auto& a : arrivals) {
      a.prompt = prefix;
      const auto q = random_ids(rng, 64, vocab);
      a.prompt.insert(a.prompt.end(), q.begin(), q.end());
      a.gen_len = 64;
    }
    for (bool cache : {true, false}) {
      EngineOptions e = eo;
      e.prefix_cache = cache;
      Engine engine(*group, nullptr, e);
      warm_up(engine, rng, o.prompt_len, vocab);
      const Result r = run(engine, arrivals);
      const std::string name = std::to_string(n) + " sharing " + std::to_string(o.shared_prefix) +
                               (cache ? " (cache on)" : " (cache off)");
      print(name.c_str(), r);
    }
  } else {
    Engine engine(*group, nullptr, eo);
    warm_up(engine, rng, o.prompt_len, vocab);
    if (o.poisson_rate > 0) {
      const std::int32_t n = o.requests > 0 ? o.requests : 256;
      std::exponential_distribution<double> gap(o.poisson_rate);
      std::vector<Arrival> arrivals(static_cast<std::size_t>(n));
      double t = 0;
      for (auto& a : arrivals) {
        a.at = t;
        t += gap(rng);
        a.prompt = random_ids(rng, o.prompt_len, vocab);
        a.gen_len = o.gen_len;
      }
      const std::string name = std::to_string(n) + " Poisson at " + std::to_string(o.poisson_rate) + "/s";
      print(name.c_str(), run(engine, arrivals));
    } else {
      for (std::int32_t c : o.concurrency) {
        std::vector<Arrival> arrivals(static_cast<std::size_t>(c));
        for (auto& a : arrivals) {
          a.prompt = random_ids(rng, o.prompt_len, vocab);
          a.gen_len = o.gen_len;
        }
        const std::string name = std::to_string(c) + " at once";
        print(name.c_str(), run(engine, arrivals));
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "serve_bench: %s\n", e.what());
  return 1;
}
