// The cuBLASLt GEMMs of batched decode (cuda/gemm.cpp) alone, at the Qwen3-1.7B and 8B layer and
// lm_head shapes (bf16, W [N, K], the lm_head writing f32 logits): the heuristic's first
// algorithm (XSERV_CUDA_GEMM_TUNE=0, before) against the fastest of its first N candidates by
// timing, with and without split-K variants (the load's warm-up tuning, after; GemmTuning), at
// the row buckets' own row counts and at rows inside buckets (the engine pads decode steps to
// multiples of 8, which take their bucket's algorithm; tuned buckets go per 32 rows). Each figure
// is the time per GEMM of back-to-back launches recorded into a CUDA graph and replayed, cycling
// over copies of the weight that together exceed the L2 cache, so every launch streams its weight
// from DRAM as in a decode step. Prints, per shape and row count:
//   us and weight TB/s of the heuristic's first, then us per tuning configuration ("16": the
//   heuristic's first 16, "16s": and split-K variants), and the algorithms (cublasLt.h's enum
//   numbers: algo id, tile, split-k, reduction, stages, ...);
// and per configuration the host time the tuning took (what the warm-up adds to a load).
// --skinny instead times the tensor-core skinny kernel (cuda/gemm_skinny.cu, rows <= 32; gate|up
// with its SwiGLU epilogue) in each of its opt-in forms, set through their environment switches
// (read at every launch): the default, XSERV_CUDA_SKINNY_DEEP=7 (two steps of weights in flight),
// XSERV_CUDA_SKINNY_BIG_WARPS=0/2/8 (the lm_head's warps a block; 0: one, the rule before
// 2026-12-04; the default is 4), deep with 2 and 4, and XSERV_CUDA_SKINNY_ACT_AHEAD=1.
// Usage: gemm_bench [--models 1.7b,8b] [--rows 24,32,...] [--configs 16,16s,32s] [--skinny 1].
// Speed is printed, never asserted.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_graph_timer.hpp"
#include "cuda/device_arena.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"

namespace {

using namespace xserv;
using namespace xserv::cuda;

using bench::graph_us_per_launch;
constexpr auto check = bench::cuda_check;

struct GemmShape {
  std::string model, name;
  std::int64_t n, k;
  float beta;  // 1: the residual add of o_proj and down
  DType out_dt;
};

std::vector<GemmShape> shapes_of(const std::string& model) {
  // Qwen3-1.7B: hidden 2048, 16 q / 8 kv heads of 128, inner 6144; 8B: 4096, 32 / 8, 12288.
  const std::int64_t d = model == "8b" ? 4096 : 2048, inner = model == "8b" ? 12288 : 6144;
  const std::int64_t qkv = (model == "8b" ? 48 : 32) * 128;
  return {{model, "q|k|v", qkv, d, 0.0f, DType::bf16},
          {model, "o_proj+res", d, d, 1.0f, DType::bf16},
          {model, "gate|up", 2 * inner, d, 0.0f, DType::bf16},
          {model, "down+res", d, inner, 1.0f, DType::bf16},
          {model, "lm_head", 151936, d, 0.0f, DType::f32}};
}

std::vector<std::string> split(const char* s) {
  std::vector<std::string> v;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) v.push_back(cur);
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return v;
}

struct Operands {
  std::vector<void*> weights;  // the copies cycled over
  void* a = nullptr;
  void* out = nullptr;
};

// Microseconds per call of launch(weight) after one eager run: back-to-back calls recorded into a
// CUDA graph and replayed, cycling over the weight copies.
template <typename Launch>
double time_launches(cudaStream_t stream, const Operands& ops, Launch launch) {
  launch(ops.weights[0]);
  check(cudaStreamSynchronize(stream), "eager run");
  const std::size_t per_graph = ops.weights.size() * ((24 + ops.weights.size() - 1) / ops.weights.size());
  return graph_us_per_launch(stream, per_graph, [&] {
    for (std::size_t i = 0; i < per_graph; ++i) launch(ops.weights[i % ops.weights.size()]);
  });
}

void free_operands(Operands& ops) {
  for (void* w : ops.weights) (void)cudaFree(w);
  (void)cudaFree(ops.a);
  (void)cudaFree(ops.out);
  ops = Operands{};
}

// Microseconds per GEMM of `m` rows through `gemm` (its plan made before the capture).
double time_gemm(cudaStream_t stream, Gemm& gemm, const GemmShape& s, const Operands& ops,
                 std::int64_t m) {
  auto launch = [&](const void* w) {
    gemm.run(DType::bf16, s.out_dt, ops.out, s.n, ops.a, w, WeightLayout::out_in, nullptr, s.beta,
             m, s.n, s.k);
  };
  return time_launches(stream, ops, launch);
}

// Microseconds per skinny GEMM of `m` rows (the SwiGLU epilogue on gate|up) with the
// environment's forms.
double time_skinny(cudaStream_t stream, const GemmShape& s, const Operands& ops, std::int64_t m, int sm_count) {
  const bool swiglu = s.name == "gate|up";
  auto launch = [&](const void* w) {
    if (swiglu)
      launch_skinny_norm_gemm(stream, ops.out, ops.a, nullptr, 1e-6f, w, true, m, s.n, s.k, sm_count, nullptr);
    else
      launch_skinny_gemm(stream, s.out_dt, ops.out, s.n, ops.a, w, nullptr, s.beta, m, s.n, s.k, sm_count);
  };
  return time_launches(stream, ops, launch);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models = {"1.7b", "8b"};
  std::vector<std::int64_t> rows = {24, 32, 40, 48, 64, 72, 96, 128, 160, 192, 256};
  std::vector<std::string> configs = {"16", "16s", "32s"};
  bool skinny = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::vector<std::string> v = split(argv[i + 1]);
    if (std::strcmp(argv[i], "--models") == 0) {
      models = v;
    } else if (std::strcmp(argv[i], "--rows") == 0) {
      rows.clear();
      for (const auto& r : v) rows.push_back(std::atoll(r.c_str()));
    } else if (std::strcmp(argv[i], "--configs") == 0) {
      configs = v;
    } else if (std::strcmp(argv[i], "--skinny") == 0) {
      skinny = v.size() == 1 && v[0] == "1";
    } else {
      std::fprintf(
          stderr,
          "usage: gemm_bench [--models 1.7b,8b] [--rows 24,32,...] [--configs 16,16s,32s] [--skinny 1]\n");
      return 2;
    }
  }
  check(cudaSetDevice(0), "device");
  int l2 = 0;
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0), "attribute");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceArena arena(0, std::size_t{256} << 20);
  std::vector<GemmTuning> tunings;
  for (const auto& c : configs)
    tunings.push_back(GemmTuning{std::atoi(c.c_str()), c.back() == 's'});
  std::int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  max_rows = std::max(max_rows, (max_rows + 31) / 32 * 32);  // a tuned bucket's own row count

  // A block of random bf16 values (truncated floats of std 0.05, the activations' scale does
  // not matter) tiled over every buffer.
  constexpr std::size_t tile_bytes = std::size_t{16} << 20;
  std::vector<std::uint16_t> host(tile_bytes / 2);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (auto& h : host) {
    const float f = normal(rng);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = static_cast<std::uint16_t>(bits >> 16);
  }
  void* tile = nullptr;
  check(cudaMalloc(&tile, tile_bytes), "malloc");
  check(cudaMemcpy(tile, host.data(), tile_bytes, cudaMemcpyHostToDevice), "upload");
  auto fill = [&](void* p, std::size_t bytes) {
    for (std::size_t off = 0; off < bytes; off += tile_bytes)
      check(cudaMemcpy(static_cast<char*>(p) + off, tile, std::min(tile_bytes, bytes - off),
                       cudaMemcpyDeviceToDevice),
            "fill");
  };

  struct Form {
    const char* name;
    const char* env;  // "NAME=VALUE" or nullptr
  };
  const Form forms[] = {{"default", nullptr},
                        {"deep", "XSERV_CUDA_SKINNY_DEEP=7"},
                        {"big0", "XSERV_CUDA_SKINNY_BIG_WARPS=0"},
                        {"big2", "XSERV_CUDA_SKINNY_BIG_WARPS=2"},
                        {"big8", "XSERV_CUDA_SKINNY_BIG_WARPS=8"},
                        {"deep+big2", "XSERV_CUDA_SKINNY_DEEP=7 XSERV_CUDA_SKINNY_BIG_WARPS=2"},
                        {"deep+big4", "XSERV_CUDA_SKINNY_DEEP=7 XSERV_CUDA_SKINNY_BIG_WARPS=4"},
                        {"act_ahead", "XSERV_CUDA_SKINNY_ACT_AHEAD=1"}};
  const auto set_form = [](const Form& f) {
    for (const char* v : {"XSERV_CUDA_SKINNY_DEEP", "XSERV_CUDA_SKINNY_BIG_WARPS", "XSERV_CUDA_SKINNY_ACT_AHEAD"})
      unsetenv(v);
    if (!f.env) return;
    std::string all = f.env;
    for (std::size_t at = 0; at < all.size();) {
      std::size_t end = all.find(' ', at);
      if (end == std::string::npos) end = all.size();
      const std::string kv = all.substr(at, end - at);
      const std::size_t eq = kv.find('=');
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
      at = end + 1;
    }
  };
  int sm_count = 0;
  check(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), "attribute");
  if (skinny)
    std::printf("L2 %d MB; the skinny kernel's forms, us per GEMM (weight TB/s)\n\n| model | shape | MB | rows |", l2 >> 20);
  else
    std::printf(
        "L2 %d MB; buckets tuned at their own row counts, then each row count timed (us per "
        "GEMM)\n\n",
        l2 >> 20);
  if (skinny) {
    for (const Form& f : forms) std::printf(" %s |", f.name);
    std::printf("\n| --- | --- | ---: | ---: |");
    for (std::size_t i = 0; i < std::size(forms); ++i) std::printf(" ---: |");
    std::printf("\n");
  }
  if (!skinny) {
    std::printf("| model | shape | MB | rows | heuristic us | TB/s |");
    for (const auto& c : configs) std::printf(" %s us |", c.c_str());
    std::printf(" heuristic algorithm | %s algorithm |\n", configs.back().c_str());
    std::printf("| --- | --- | ---: | ---: | ---: | ---: |");
    for (std::size_t i = 0; i < configs.size(); ++i) std::printf(" ---: |");
    std::printf(" --- | --- |\n");
  }
  std::vector<double> tune_seconds(configs.size(), 0.0);
  for (const std::string& model : models) {
    for (const GemmShape& s : shapes_of(model)) {
      const std::size_t w_bytes = static_cast<std::size_t>(s.n * s.k) * 2;
      const std::size_t copies =
          std::clamp<std::size_t>((2 * static_cast<std::size_t>(l2) + w_bytes - 1) / w_bytes, 1, 8);
      Operands ops;
      for (std::size_t i = 0; i < copies; ++i) {
        void* w = nullptr;
        check(cudaMalloc(&w, w_bytes), "malloc weight");
        fill(w, w_bytes);
        ops.weights.push_back(w);
      }
      const std::size_t a_bytes = static_cast<std::size_t>(max_rows * s.k) * 2;
      const std::size_t out_bytes = static_cast<std::size_t>(max_rows * s.n) * dtype_size(s.out_dt);
      check(cudaMalloc(&ops.a, a_bytes), "malloc a");
      fill(ops.a, a_bytes);
      check(cudaMalloc(&ops.out, out_bytes), "malloc out");
      check(cudaMemset(ops.out, 0, out_bytes), "memset out");

      if (skinny) {
        for (std::int64_t m : rows) {
          if (!skinny_gemm_supported(DType::bf16, m, s.n, s.k, ops.a, ops.weights[0], max_skinny_gemm_rows)) continue;
          std::printf("| %s | %s | %.1f | %lld |", model.c_str(), s.name.c_str(), w_bytes / 1e6,
                      static_cast<long long>(m));
          for (const Form& f : forms) {
            set_form(f);
            const double us = time_skinny(stream, s, ops, m, sm_count);
            std::printf(" %.2f (%.2f) |", us, w_bytes / us / 1e6);
          }
          set_form(forms[0]);
          std::printf("\n");
          std::fflush(stdout);
        }
        free_operands(ops);
        continue;
      }
      Gemm heuristic(stream, arena);
      std::vector<std::unique_ptr<Gemm>> tuned;
      for (std::size_t c = 0; c < tunings.size(); ++c) {
        tuned.push_back(std::make_unique<Gemm>(stream, arena, tunings[c]));
        Gemm& g = *tuned.back();
        std::vector<std::int64_t> buckets;  // each tuned at its own row count, as the warm-up does
        for (std::int64_t m : rows) buckets.push_back(g.bucket_rows(m));
        std::sort(buckets.begin(), buckets.end());
        buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
        g.set_tuning(true);
        const auto t0 = std::chrono::steady_clock::now();
        for (std::int64_t b : buckets)
          g.run(DType::bf16, s.out_dt, ops.out, s.n, ops.a, ops.weights[0], WeightLayout::out_in,
                nullptr, s.beta, b, s.n, s.k);
        check(cudaStreamSynchronize(stream), "tuning");
        tune_seconds[c] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        g.set_tuning(false);
      }
      for (std::int64_t m : rows) {
        const double h_us = time_gemm(stream, heuristic, s, ops, m);
        const std::string h_algo = heuristic.last_algorithm();
        std::printf("| %s | %s | %.1f | %lld | %.1f | %.2f |", model.c_str(), s.name.c_str(),
                    w_bytes / 1e6, static_cast<long long>(m), h_us, w_bytes / h_us / 1e6);
        std::string last_algo;
        for (auto& g : tuned) {
          std::printf(" %.1f |", time_gemm(stream, *g, s, ops, m));
          last_algo = g->last_algorithm();
        }
        std::printf(" %s | %s |\n", h_algo.c_str(), last_algo.c_str());
        std::fflush(stdout);
      }
      free_operands(ops);
    }
  }
  std::printf("\ntuning time (host, all shapes and buckets of the models above):");
  for (std::size_t c = 0; c < configs.size(); ++c)
    std::printf(" %s %.3f s;", configs[c].c_str(), tune_seconds[c]);
  std::printf("\n");
  (void)cudaFree(tile);
  (void)cudaStreamDestroy(stream);
  return 0;
}
