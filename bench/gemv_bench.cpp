// The decode GEMVs of cuda/gemv.cu alone, at the one-row shapes of Qwen3 0.6B / 1.7B / 8B decode
// steps (bf16) and GPT-2's f32 lm_head, over a sweep of launch shapes (gemv_tuning(): warps per
// output column). Each figure is the time per launch of 60 launches
// recorded into a CUDA graph and replayed (as a decode step runs them: back to back), cycling
// over copies of the weight that together exceed the L2 cache, so every launch streams its
// weight from DRAM as in a real step. Prints one line per shape and launch shape:
//   shape  MB  wpr  us  TB/s
// ("wpr 0" is the default the backend picks; named rows are GemvTuning variants, and "read xN"
// a pure streaming read of the same bytes by N blocks an SM, the ceiling). Usage: gemv_bench
// [--quick | --variants] (--quick: the defaults only; --variants: the defaults, the variants and
// the read ceiling, no split sweep). Speed is printed, never asserted.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/kernels.hpp"
#include "cuda_graph_timer.hpp"

namespace {

using namespace xserv;
using namespace xserv::cuda;

using bench::graph_us_per_launch;
constexpr auto check = bench::cuda_check;

enum class Kind { plain, residual, norm, swiglu };

struct Shape {
  const char* name;
  Kind kind;
  std::int64_t n, k;  // output columns, reduction length (swiglu: W has 2n rows)
  DType dt = DType::bf16;
  DType out_dt = DType::bf16;
};

constexpr int launches = 60;

// Microseconds per launch of `s` under the current gemv_tuning().
double time_shape(cudaStream_t stream, const Shape& s, const std::vector<void*>& weights, void* x,
                  void* norm_w, void* out, int sm_count) {
  return graph_us_per_launch(stream, launches, [&] {
    for (int i = 0; i < launches; ++i) {
      void* w = weights[static_cast<std::size_t>(i) % weights.size()];
      switch (s.kind) {
        case Kind::plain:
        case Kind::residual:
          launch_gemv(stream, s.dt, s.out_dt, false, out, s.n, x, w, nullptr, s.kind == Kind::residual ? 1.0f : 0.0f,
                      1, s.n, s.k, sm_count, nullptr, nullptr);
          break;
        case Kind::norm:
        case Kind::swiglu:
          launch_norm_gemv(stream, s.dt, out, x, norm_w, 1e-6f, w, s.kind == Kind::swiglu, 1, s.n, s.k, sm_count, s.dt);
          break;
      }
    }
  });
}

}  // namespace

// The GemvTuning variants measured next to the default (issue 12, 2026-12-03): name and setter.
struct Variant {
  const char* name;
  void (*set)(GemvTuning&);
};
const Variant variants[] = {
    {"bulk<=40MB", [](GemvTuning& t) { t.bulk_max_mb = 40; }},
    {"bulk_wide", [](GemvTuning& t) { t.bulk_wide = true; }},
    {"norm_occ", [](GemvTuning& t) { t.norm_occ = 3; }},
    {"evict_first", [](GemvTuning& t) { t.evict_first = true; }},
    {"norm_persist", [](GemvTuning& t) { t.norm_persist = true; }},
};

// Microseconds per pure streaming read of `bytes` (launch_read_probe, `blocks` blocks), cycling
// over the same copies.
double time_read(cudaStream_t stream, std::size_t bytes, const std::vector<void*>& weights, unsigned* sink, int blocks) {
  return graph_us_per_launch(stream, launches, [&] {
    for (int i = 0; i < launches; ++i)
      launch_read_probe(stream, weights[static_cast<std::size_t>(i) % weights.size()], bytes, sink, blocks);
  });
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool with_variants = argc > 1 && std::strcmp(argv[1], "--variants") == 0;
  check(cudaSetDevice(0), "device");
  int sm_count = 0;
  check(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), "attribute");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  // Qwen3-8B: hidden 4096, 32 q / 8 kv heads of 128, inner 12288; 1.7B: 2048, 16 / 8, 6144;
  // 0.6B: 1024, 16 / 8, 3072; vocab 151936. GPT-2's lm_head: 50257 x 768 f32.
  const Shape shapes[] = {
      {"8b q|k|v+norm", Kind::norm, 6144, 4096},
      {"8b o_proj+res", Kind::residual, 4096, 4096},
      {"8b gate|up+norm+swiglu", Kind::swiglu, 12288, 4096},
      {"8b down+res", Kind::residual, 4096, 12288},
      {"8b lm_head", Kind::plain, 151936, 4096, DType::bf16, DType::f32},
      {"1.7b q|k|v+norm", Kind::norm, 4096, 2048},
      {"1.7b o_proj+res", Kind::residual, 2048, 2048},
      {"1.7b gate|up+norm+swiglu", Kind::swiglu, 6144, 2048},
      {"1.7b down+res", Kind::residual, 2048, 6144},
      {"0.6b q|k|v+norm", Kind::norm, 4096, 1024},
      {"0.6b o_proj+res", Kind::residual, 1024, 2048},
      {"0.6b gate|up+norm+swiglu", Kind::swiglu, 3072, 1024},
      {"0.6b down+res", Kind::residual, 1024, 3072},
      {"0.6b lm_head", Kind::plain, 151936, 1024, DType::bf16, DType::f32},
      {"gpt2 lm_head f32", Kind::plain, 50257, 768, DType::f32, DType::f32},
  };
  std::vector<int> configs = {0};  // 0: the measured rule
  if (!quick && !with_variants) configs.insert(configs.end(), {1, 2, 4, 8});
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned)), "malloc");
  std::printf("| shape | MB | wpr | us | TB/s |\n| --- | ---: | ---: | ---: | ---: |\n");
  for (const Shape& s : shapes) {
    const std::int64_t rows = s.kind == Kind::swiglu ? 2 * s.n : s.n;
    const std::size_t bytes = static_cast<std::size_t>(rows * s.k) * dtype_size(s.dt);
    // Enough copies to pass 256 MB (L2 is 50 MB), at least two.
    const std::size_t copies = std::clamp<std::size_t>((std::size_t{256} << 20) / bytes + 1, 2, 64);
    std::vector<void*> weights(copies);
    for (auto& w : weights) {
      check(cudaMalloc(&w, bytes), "malloc weights");
      check(cudaMemset(w, 0x3c, bytes), "memset");  // bf16 0x3c3c ~ 0.011, f32 ~ 0.011: finite
    }
    void *x = nullptr, *norm_w = nullptr, *out = nullptr;
    check(cudaMalloc(&x, static_cast<std::size_t>(s.k) * 4), "malloc");
    check(cudaMalloc(&norm_w, static_cast<std::size_t>(s.k) * 4), "malloc");
    check(cudaMalloc(&out, static_cast<std::size_t>(s.n) * 4), "malloc");
    check(cudaMemset(x, 0x3c, static_cast<std::size_t>(s.k) * 4), "memset");
    check(cudaMemset(norm_w, 0x3c, static_cast<std::size_t>(s.k) * 4), "memset");
    check(cudaMemset(out, 0, static_cast<std::size_t>(s.n) * 4), "memset");
    double best = 1e30;
    int best_wpr = 0;
    for (int wpr : configs) {
      const bool norm = s.kind == Kind::norm || s.kind == Kind::swiglu;
      GemvTuning& t = gemv_tuning();
      t = GemvTuning{};
      (norm ? t.norm_wpr : t.wpr) = wpr;
      const double us = time_shape(stream, s, weights, x, norm_w, out, sm_count);
      std::printf("| %s | %.1f | %d | %.2f | %.2f |\n", s.name, static_cast<double>(bytes) / 1e6, wpr, us,
                  static_cast<double>(bytes) / us / 1e6);
      if (us < best) {
        best = us;
        best_wpr = wpr;
      }
    }
    if (with_variants) {
      for (const Variant& v : variants) {
        GemvTuning& t = gemv_tuning();
        t = GemvTuning{};
        v.set(t);
        const double us = time_shape(stream, s, weights, x, norm_w, out, sm_count);
        std::printf("| %s | %.1f | %s | %.2f | %.2f |\n", s.name, static_cast<double>(bytes) / 1e6, v.name, us,
                    static_cast<double>(bytes) / us / 1e6);
      }
      for (int per_sm : {2, 4, 8}) {
        const double us = time_read(stream, bytes, weights, sink, per_sm * sm_count);
        std::printf("| %s | %.1f | read x%d | %.2f | %.2f |\n", s.name, static_cast<double>(bytes) / 1e6, per_sm, us,
                    static_cast<double>(bytes) / us / 1e6);
      }
    }
    std::printf("best %s: wpr %d, %.2f us\n", s.name, best_wpr, best);
    gemv_tuning() = GemvTuning{};
    for (auto* w : weights) (void)cudaFree(w);
    (void)cudaFree(x);
    (void)cudaFree(norm_w);
    (void)cudaFree(out);
  }
  (void)cudaFree(sink);
  check(cudaGetLastError(), "launches");
  return 0;
}
