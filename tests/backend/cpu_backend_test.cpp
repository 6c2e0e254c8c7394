// CPU backend ops against naive references (double precision, written here) on random inputs:
// odd sizes, every weight dtype, every kernel table this CPU runs, paged multi-sequence batches
// with shuffled block tables and GQA ratios 1/2/4.
#include "backend/cpu/cpu_backend.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <string_view>

#include "backend/cpu/cpu_amx.hpp"
#include "core/error.hpp"
#include "cpu_test_util.hpp"
#include "support/scoped_env.hpp"

#ifdef XSERV_TEST_HAVE_AVX2X16
namespace xserv::cpu::avx2x16 { extern const KernelTable table; }  // cpu_kernels_avx2x16.cpp
#endif

using namespace xserv;
using xserv::cpu::CpuBackend;
using namespace xserv::test;

namespace {

constexpr DType kWeightTypes[] = {DType::f32, DType::bf16, DType::f16};

// Every kernel table on xserv's own GEMM, plus the default backend (OpenBLAS when built in).
std::vector<std::unique_ptr<CpuBackend>> every_backend(std::size_t threads = 3) {
  std::vector<std::unique_ptr<CpuBackend>> v;
  const auto tables = cpu::supported_kernels();
  for (const auto* k : tables)
    v.push_back(std::make_unique<CpuBackend>(BackendOptions{threads, 0}, k, false));
#ifdef XSERV_TEST_HAVE_AVX2X16
  // Without AVX-512, its copy's logic still runs: the 16-float kernels compiled for AVX2.
  if (tables.back()->isa == std::string_view("avx2"))
    v.push_back(std::make_unique<CpuBackend>(BackendOptions{threads, 0}, &cpu::avx2x16::table, false));
#endif
  v.push_back(std::make_unique<CpuBackend>(BackendOptions{threads, 0}));
  return v;
}

// GPT-2's gelu (the tanh approximation, as HF's gelu_new), in double.
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// The out block handed to a kernel that writes columns [n0, n1) of an [m, n] result: NaN
// outside them (a test then requires them untouched) and inside them too when beta = 0 (the
// kernel must not read out then); out0 inside them otherwise.
std::vector<float> column_block_out(const std::vector<float>& out0, std::int64_t m, std::int64_t n,
                                    std::int64_t n0, std::int64_t n1, float beta) {
  std::vector<float> out(static_cast<std::size_t>(m * n), NAN);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = n0; j < n1 && beta != 0.0f; ++j)
      out[static_cast<std::size_t>(i * n + j)] = out0[static_cast<std::size_t>(i * n + j)];
  return out;
}

// Requires `got` to be out = a [m, k] . W [k, n] (+ bias) + beta * out0 within 2e-6 of the sum
// of magnitudes (a naive double reference; weight(k, j) gives W's element), over rows of ldo
// with the columns past n untouched.
template <typename WeightAt>
void require_gemm_matches_naive(const std::vector<float>& got, const std::vector<float>& out0,
                                const std::vector<float>& a, std::int64_t m, std::int64_t k, std::int64_t n,
                                std::int64_t ldo, const float* bias, float beta, WeightAt weight) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < ldo; ++j) {
      const auto o = static_cast<std::size_t>(i * ldo + j);
      if (j >= n) {  // columns past the slice are untouched
        REQUIRE(std::isnan(got[o]) == std::isnan(out0[o]));
        continue;
      }
      double want = 0.0, mag = 1.0;
      for (std::int64_t r = 0; r < k; ++r) {
        const double v = a[static_cast<std::size_t>(i * k + r)] * static_cast<double>(weight(r, j));
        want += v;
        mag += std::abs(v);
      }
      if (bias != nullptr) want += bias[j];
      if (beta != 0.0f) want += beta * out0[o];
      INFO("row " << i << " col " << j << " got " << got[o] << " want " << want);
      REQUIRE(std::abs(got[o] - want) <= 2e-6 * mag);
    }
}

}  // namespace

TEST_CASE("cpu gemm matches a naive reference for both layouts and all weight dtypes", "[cpu]") {
  std::mt19937 rng(1);
  struct Case {
    std::int64_t m, k, n;
  };
  const Case cases[] = {{1, 7, 5},    {1, 300, 257}, {2, 64, 33},  {5, 33, 70},  {8, 130, 200},
                        {9, 77, 50},  {13, 256, 129}, {40, 300, 140}, {70, 129, 300}, {3, 0, 4},
                        // GEMV column blocking (4, 2 or 1 columns per pass) with remainders.
                        {1, 128, 67}, {2, 48, 7}, {3, 40, 9}, {4, 100, 67}, {6, 33, 3}};
  for (auto& be : every_backend()) {
    for (const auto& c : cases) {
      for (DType wt : kWeightTypes) {
        for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
          const bool out_in = layout == WeightLayout::out_in;
          const bool with_bias = (c.m + c.n) % 2 == 0, strided = c.m % 3 == 1;
          const float beta = c.n % 2 ? 1.0f : 0.0f;
          INFO(be->name() << " m=" << c.m << " k=" << c.k << " n=" << c.n << " w="
                          << dtype_name(wt) << " out_in=" << out_in << " beta=" << beta);
          auto a = random_floats(rng, static_cast<std::size_t>(c.m * c.k));
          auto w = make_weight(rng, static_cast<std::size_t>(c.k * c.n), wt);
          auto bias = make_weight(rng, static_cast<std::size_t>(c.n), wt);
          const std::int64_t ldo = strided ? c.n + 3 : c.n;
          auto out = random_floats(rng, static_cast<std::size_t>(c.m * ldo));
          if (beta == 0.0f) std::fill(out.begin(), out.end(), NAN);  // must be ignored
          std::vector<float> got = out;
          const Shape ws = out_in ? Shape{c.n, c.k} : Shape{c.k, c.n};
          be->gemm(Tensor(got.data(), DType::f32, Shape{c.m, c.n}), view(a, {c.m, c.k}),
                   w.tensor(ws), layout, with_bias ? bias.tensor({c.n}) : Tensor{}, beta,
                   strided ? ldo : 0);
          require_gemm_matches_naive(got, out, a, c.m, c.k, c.n, ldo, with_bias ? bias.values.data() : nullptr,
                                     beta, [&](std::int64_t r, std::int64_t j) {
                                       return w.values[static_cast<std::size_t>(out_in ? j * c.k + r : r * c.n + j)];
                                     });
        }
      }
    }
  }
}

namespace {
// w [K, N] (in_out) reordered into 32-column panels (WeightLayout::panel32), as
// Model::pack_panels does at load.
TypedWeight to_panels(const TypedWeight& w, std::int64_t k, std::int64_t n) {
  constexpr std::int64_t pw = weight_panel_width;
  TypedWeight out = w;
  for (std::int64_t p = 0; p < n / pw; ++p)
    for (std::int64_t r = 0; r < k; ++r)
      for (std::int64_t j = 0; j < pw; ++j) {
        const auto to = static_cast<std::size_t>((p * k + r) * pw + j);
        const auto from = static_cast<std::size_t>(r * n + p * pw + j);
        out.values[to] = w.values[from];
        if (!w.half.empty()) out.half[to] = w.half[from];
      }
  return out;
}
}  // namespace

// panel32 weights: the GEMV (1-8 rows, every row count's register blocking) and the prefill GEMM
// (f32 panels multiplied in place, the other dtypes packed from them; K across several K tiles
// and a short last one; every split of the columns over 3 threads) on every kernel table.
TEST_CASE("cpu gemm over 32-column panel weights matches a naive reference", "[cpu]") {
  std::mt19937 rng(5);
  struct Case {
    std::int64_t m, k, n;
  };
  const Case cases[] = {{1, 7, 32},   {1, 300, 160}, {2, 64, 64},  {3, 33, 96},  {4, 129, 32},
                        {5, 40, 64},  {8, 130, 96},  {9, 77, 32},  {13, 256, 128}, {40, 600, 160},
                        {128, 260, 320}, {3, 0, 32}};
  for (auto& be : every_backend()) {
    for (const auto& c : cases) {
      for (DType wt : kWeightTypes) {
        const bool with_bias = (c.m + c.k) % 2 == 0, strided = c.m % 3 == 1;
        const float beta = c.k % 2 ? 1.0f : 0.0f;
        INFO(be->name() << " m=" << c.m << " k=" << c.k << " n=" << c.n << " w=" << dtype_name(wt)
                        << " beta=" << beta);
        auto a = random_floats(rng, static_cast<std::size_t>(c.m * c.k));
        const auto w = make_weight(rng, static_cast<std::size_t>(c.k * c.n), wt);
        auto panels = to_panels(w, c.k, c.n);
        auto bias = make_weight(rng, static_cast<std::size_t>(c.n), wt);
        const std::int64_t ldo = strided ? c.n + 3 : c.n;
        auto out = random_floats(rng, static_cast<std::size_t>(c.m * ldo));
        if (beta == 0.0f) std::fill(out.begin(), out.end(), NAN);  // must be ignored
        std::vector<float> got = out;
        be->gemm(Tensor(got.data(), DType::f32, Shape{c.m, c.n}), view(a, {c.m, c.k}),
                 panels.tensor({c.k, c.n}), WeightLayout::panel32,
                 with_bias ? bias.tensor({c.n}) : Tensor{}, beta, strided ? ldo : 0);
        require_gemm_matches_naive(got, out, a, c.m, c.k, c.n, ldo, with_bias ? bias.values.data() : nullptr, beta,
                                   [&](std::int64_t r, std::int64_t j) {
                                     return w.values[static_cast<std::size_t>(r * c.n + j)];
                                   });
      }
    }
  }
  // N must be whole panels.
  CpuBackend be(BackendOptions{1, 0});
  std::vector<float> a(4), w(2 * 40), o(2 * 40);
  REQUIRE_THROWS_AS(be.gemm(view(o, {2, 40}), view(a, {2, 2}), view(w, {2, 40}),
                            WeightLayout::panel32, Tensor{}),
                    Error);
}

// The prefill GEMM's tile loop with each K tile depth and prefetch (GemmProblem's kc,
// pack_prefetch, first_tile_prefetch; the backend reads them from XSERV_CPU_GEMM_* once),
// called on every kernel table directly: several K tiles (K > kc), a short last K tile, ragged
// rows and panels, no K at all, a prefetch that runs on into the next column tile, and the
// epilogue (bias, beta) that the first K tile writes.
TEST_CASE("cpu prefill GEMM tiles: K tile depths, prefetch levels and the epilogue", "[cpu]") {
  std::mt19937 rng(7);
  struct Case {
    std::int64_t m, k, n, n0, n1;
  };
  const Case cases[] = {{9, 300, 70, 0, 70}, {21, 523, 100, 32, 100}, {128, 260, 40, 0, 40},
                        {17, 5, 33, 0, 33}, {10, 0, 20, 0, 20}};
  std::vector<float> scratch_store(static_cast<std::size_t>(cpu::gemm_scratch_floats + 16));
  float* scratch = reinterpret_cast<float*>(
      (reinterpret_cast<std::uintptr_t>(scratch_store.data()) + 63) & ~std::uintptr_t{63});
  for (const auto* kt : cpu::supported_kernels())
    for (const auto& c : cases)
      for (DType wt : kWeightTypes)
        for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
          const bool out_in = layout == WeightLayout::out_in;
          // The epilogue rides on the first K tile: with a bias and beta = 1 on out_in weights,
          // without either on in_out ones.
          const float beta = out_in ? 1.0f : 0.0f;
          auto a = random_floats(rng, static_cast<std::size_t>(c.m * c.k));
          auto w = make_weight(rng, static_cast<std::size_t>(c.k * c.n), wt);
          auto bias = random_floats(rng, static_cast<std::size_t>(c.n));
          const auto out0 = random_floats(rng, static_cast<std::size_t>(c.m * c.n));
          std::vector<double> want(static_cast<std::size_t>(c.m * c.n)), mag(want.size());
          for (std::int64_t i = 0; i < c.m; ++i)
            for (std::int64_t j = c.n0; j < c.n1; ++j) {
              const auto o = static_cast<std::size_t>(i * c.n + j);
              double s = out_in ? bias[static_cast<std::size_t>(j)] + beta * out0[o] : 0.0;
              double s_abs = 0.0;
              for (std::int64_t k = 0; k < c.k; ++k) {
                const double v = a[static_cast<std::size_t>(i * c.k + k)] *
                                 static_cast<double>(w.values[static_cast<std::size_t>(
                                     out_in ? j * c.k + k : k * c.n + j)]);
                s += v;
                s_abs += std::abs(v);
              }
              want[static_cast<std::size_t>(i * c.n + j)] = s;
              mag[static_cast<std::size_t>(i * c.n + j)] = s_abs + 1.0;
            }
          struct Variant {
            std::int64_t kc;
            int level;
            bool first = false;
            bool gelu = false;
          };
          const Variant variants[] = {
              {0, 1}, {0, 2}, {0, 0}, {64, 1}, {100, 2}, {0, 1, true}, {0, 1, true, true}};
          for (const Variant& v : variants) {
            INFO(kt->isa << " m=" << c.m << " k=" << c.k << " n=" << c.n << " w=" << dtype_name(wt)
                         << " out_in=" << out_in << " kc=" << v.kc << " prefetch=" << v.level
                         << " first=" << v.first << " gelu=" << v.gelu);
            std::vector<float> out = column_block_out(out0, c.m, c.n, c.n0, c.n1, beta);
            cpu::GemmProblem p;
            p.a = a.data();
            p.m = c.m;
            p.k = c.k;
            p.n = c.n;
            p.w = w.tensor(out_in ? Shape{c.n, c.k} : Shape{c.k, c.n}).data;
            p.w_dtype = wt;
            p.layout = layout;
            p.out = out.data();
            p.ldo = c.n;
            p.bias = out_in ? bias.data() : nullptr;
            p.beta = beta;
            p.kc = v.kc;
            p.pack_prefetch = v.level;
            p.first_tile_prefetch = v.first;
            p.gelu = v.gelu;
            kt->gemm_tile(p, 0, c.m, c.n0, c.n1, scratch);
            for (std::int64_t i = 0; i < c.m; ++i)
              for (std::int64_t j = 0; j < c.n; ++j) {
                const auto o = static_cast<std::size_t>(i * c.n + j);
                if (j < c.n0 || j >= c.n1) {  // outside the tile: untouched
                  REQUIRE(std::isnan(out[o]));
                  continue;
                }
                // gelu_tanh's slope is at most 1.13: the sum's error bound grows by that.
                const double expect = p.gelu ? gelu_tanh(want[o]) : want[o];
                INFO("row " << i << " col " << j << " got " << out[o] << " want " << expect);
                REQUIRE(std::abs(out[o] - expect) <= (p.gelu ? 3e-6 : 2e-6) * mag[o]);
              }
          }
        }
}

// The decode GEMV's L1 prefetch distance (GemmProblem::gemv_l1_ahead, XSERV_CPU_GEMV_L1_KB), the
// tile head's L2 prefetch (gemv_prefetch_head, XSERV_CPU_GEMV_HEAD; tiles shorter and longer
// than the L2 distance) and narrow column ranges (XSERV_CPU_GEMV_GROUP_KB's 4-column groups)
// change which lines are prefetched and which thread writes a column, never a column's sum:
// every kernel table, every weight dtype, 1-8 rows; bit-identical to one call over all columns
// with the rule before (and with XSERV_CPU_GEMV_SEQ's kernel, to one call of that kernel).
TEST_CASE("cpu GEMV: prefetch distances, tile heads and 4-column ranges give the same bits",
          "[cpu]") {
  std::mt19937 rng(11);
  struct Case {
    std::int64_t m, k, n;
  };
  const Case cases[] = {{1, 3072, 23}, {1, 300, 37}, {2, 768, 17},
                        {3, 129, 21},  {5, 1024, 9}, {8, 40, 13}};
  std::vector<float> scratch_store(static_cast<std::size_t>(cpu::gemm_scratch_floats + 16));
  float* scratch = reinterpret_cast<float*>(
      (reinterpret_cast<std::uintptr_t>(scratch_store.data()) + 63) & ~std::uintptr_t{63});
  for (const auto* kt : cpu::supported_kernels())
    for (const auto& c : cases)
      for (DType wt : kWeightTypes) {
        auto a = random_floats(rng, static_cast<std::size_t>(c.m * c.k));
        auto w = make_weight(rng, static_cast<std::size_t>(c.k * c.n), wt);
        auto bias = random_floats(rng, static_cast<std::size_t>(c.n));
        cpu::GemmProblem p;
        p.a = a.data();
        p.m = c.m;
        p.k = c.k;
        p.n = c.n;
        p.w = w.tensor(Shape{c.n, c.k}).data;
        p.w_dtype = wt;
        p.layout = WeightLayout::out_in;
        p.bias = bias.data();
        p.ldo = c.n;
        p.gemv_prefetch_l2 = 32 * 1024;
        std::vector<float> rule_before(static_cast<std::size_t>(c.m * c.n), NAN);
        p.out = rule_before.data();
        kt->gemm_tile(p, 0, c.m, 0, c.n, scratch);
        // The one-row kernel that reads W rows in order (gemv_seq) sums in another order: within
        // 2e-6 of the sum of |products| of the one above, and then the same bits under every
        // prefetch and split, as that one.
        for (const bool seq : {false, true}) {
          std::vector<float> want = rule_before;
          if (seq) {
            p.out = want.data();
            p.gemv_seq = true;
            p.gemv_l1_ahead = 0;
            p.gemv_prefetch_head = false;
            kt->gemm_tile(p, 0, c.m, 0, c.n, scratch);
            for (std::int64_t i = 0; i < c.m; ++i)
              for (std::int64_t j = 0; j < c.n; ++j) {
                double mag = 1.0;
                for (std::int64_t k = 0; k < c.k; ++k)
                  mag += std::abs(
                      a[static_cast<std::size_t>(i * c.k + k)] *
                      static_cast<double>(w.values[static_cast<std::size_t>(j * c.k + k)]));
                const auto o = static_cast<std::size_t>(i * c.n + j);
                INFO(kt->isa << " seq m=" << c.m << " k=" << c.k << " w=" << dtype_name(wt)
                             << " col " << j);
                REQUIRE(std::abs(want[o] - rule_before[o]) <= 2e-6 * mag);
              }
          }
          for (const std::int64_t ahead : {std::int64_t{64}, std::int64_t{1000},
                                           std::int64_t{12 * 1024}, std::int64_t{1} << 20})
            for (const std::int64_t piece : {std::int64_t{4}, c.n})
              for (const bool head : {false, true}) {
                INFO(kt->isa << " m=" << c.m << " k=" << c.k << " n=" << c.n
                             << " w=" << dtype_name(wt) << " l1 ahead=" << ahead
                             << " piece=" << piece << " head=" << head << " seq=" << seq);
                std::vector<float> got(want.size(), NAN);
                p.out = got.data();
                p.gemv_l1_ahead = ahead;
                p.gemv_prefetch_head = head;
                for (std::int64_t n0 = 0; n0 < c.n; n0 += piece)
                  kt->gemm_tile(p, 0, c.m, n0, std::min(c.n, n0 + piece), scratch);
                REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
              }
        }
      }
}

TEST_CASE("cpu GEMV column groups: 16 columns, or narrower by 4 within XSERV_CPU_GEMV_GROUP_KB",
          "[cpu]") {
  REQUIRE(cpu::gemv_group_cols(3072 * 4, 0) == 16);         // unset: 16 always
  REQUIRE(cpu::gemv_group_cols(3072 * 4, 64 * 1024) == 4);  // GPT-2's f32 down: 48 KB groups
  REQUIRE(cpu::gemv_group_cols(768 * 4, 64 * 1024) == 16);  // 48 KB already
  REQUIRE(cpu::gemv_group_cols(1024 * 2 * 3, 64 * 1024) == 8);
  REQUIRE(cpu::gemv_group_cols(1 << 20, 64 * 1024) == 4);  // never under 4
}

// The huge-page allocator (XSERV_CPU_HUGEPAGES=1, opt-in; read once per process, so the test
// takes it directly and covers it whatever the switch): from 2 MB up an allocation is its own
// mapping on a 2 MB boundary, advised for transparent huge pages; smaller ones 64-byte aligned.
// CpuBackend::allocator is it with the switch at 1 and cpu_allocator otherwise (the default).
TEST_CASE("cpu backend allocator: large blocks on 2 MB boundaries, every byte usable", "[cpu]") {
  CpuBackend be(BackendOptions{1, 0});
  const char* env = std::getenv("XSERV_CPU_HUGEPAGES");
  const bool switched_on = env && std::string_view(env) == "1";
  REQUIRE(&be.allocator() == (switched_on ? &cpu::hugepage_allocator() : &cpu_allocator()));
  for (Allocator* alloc : {&cpu::hugepage_allocator(), &be.allocator()}) {
    const bool huge = alloc == &cpu::hugepage_allocator();
    for (const std::size_t bytes : {std::size_t{100}, std::size_t{(1u << 20) + 3}, std::size_t{2u << 20},
                                    std::size_t{(3u << 20) + 5}, std::size_t{9u << 20}}) {
      INFO("bytes " << bytes << " huge-page allocator " << huge);
      Buffer b(*alloc, bytes);
      const auto at = reinterpret_cast<std::uintptr_t>(b.data());
      REQUIRE(at % 64 == 0);
      if (huge && bytes >= (2u << 20)) REQUIRE(at % (2u << 20) == 0);
      auto* p = static_cast<unsigned char*>(b.data());
      for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < bytes; ++i) bad += p[i] != static_cast<unsigned char>(i * 7);
      REQUIRE(bad == 0);
    }
  }
}

TEST_CASE("cpu layer_norm_gemm with the GELU fused equals the three ops one by one", "[cpu]") {
  // The CPU backend applies the GELU inside the GEMM (each output tile as it is finished, or at
  // the GEMV's store); Backend::layer_norm_gemm runs layer_norm, gemm and gelu separately.
  std::mt19937 rng(11);
  struct Case {
    std::int64_t m, k, n;
  };
  const Case cases[] = {{1, 33, 70}, {4, 256, 67}, {9, 300, 200}, {40, 77, 129}, {130, 260, 300}};
  for (auto& be : every_backend()) {
    for (const auto& c : cases) {
      for (DType wt : kWeightTypes) {
        for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
          for (bool gelu : {false, true}) {
            INFO(be->name() << " m=" << c.m << " k=" << c.k << " n=" << c.n << " w="
                            << dtype_name(wt) << " out_in=" << (layout == WeightLayout::out_in)
                            << " gelu=" << gelu);
            auto x = random_floats(rng, static_cast<std::size_t>(c.m * c.k), -2.0f, 2.0f);
            auto g = make_weight(rng, static_cast<std::size_t>(c.k), wt);
            auto gb = make_weight(rng, static_cast<std::size_t>(c.k), wt);
            auto w = make_weight(rng, static_cast<std::size_t>(c.k * c.n), wt);
            auto bias = make_weight(rng, static_cast<std::size_t>(c.n), wt);
            const Shape ws = layout == WeightLayout::out_in ? Shape{c.n, c.k} : Shape{c.k, c.n};
            std::vector<float> got(static_cast<std::size_t>(c.m * c.n), NAN), want = got;
            std::vector<float> h(x.size()), h2(x.size());
            be->layer_norm_gemm(view(got, {c.m, c.n}), view(x, {c.m, c.k}), g.tensor({c.k}),
                                gb.tensor({c.k}), 1e-5f, w.tensor(ws), layout, bias.tensor({c.n}),
                                gelu, view(h, {c.m, c.k}));
            be->Backend::layer_norm_gemm(view(want, {c.m, c.n}), view(x, {c.m, c.k}),
                                         g.tensor({c.k}), gb.tensor({c.k}), 1e-5f, w.tensor(ws),
                                         layout, bias.tensor({c.n}), gelu, view(h2, {c.m, c.k}));
            require_close(got, std::vector<double>(want.begin(), want.end()), 1e-6, 1e-6);
          }
        }
      }
    }
  }
}

TEST_CASE("cpu gemm_parts matches a naive reference, one part per column range", "[cpu]") {
  std::mt19937 rng(11);
  // Parts as q/k/v (with and without biases) and gate/up; M = 1..8 runs one GEMV loop over all
  // parts, M = 9 the per-part GEMMs. Part widths not multiples of 16 cross the column groups.
  const std::vector<std::int64_t> part_sets[] = {{40, 8, 8}, {33, 17, 70}, {64, 64}, {5}};
  for (auto& be : every_backend()) {
    for (const std::int64_t m : {1, 3, 8, 9}) {
      for (const auto& parts : part_sets) {
        for (DType wt : kWeightTypes) {
          const bool with_bias = parts.size() == 3 && m != 3;
          const std::int64_t k = 70 + m;
          std::int64_t width = 0;
          for (auto n : parts) width += n;
          INFO(be->name() << " m=" << m << " parts=" << parts.size() << " width=" << width
                          << " w=" << dtype_name(wt) << " bias=" << with_bias);
          auto a = random_floats(rng, static_cast<std::size_t>(m * k));
          std::vector<TypedWeight> w, b;
          std::vector<Tensor> wt_views, b_views;
          for (auto n : parts) {
            w.push_back(make_weight(rng, static_cast<std::size_t>(n * k), wt));
            b.push_back(make_weight(rng, static_cast<std::size_t>(n), wt));
          }
          for (std::size_t i = 0; i < parts.size(); ++i) {
            wt_views.push_back(w[i].tensor({parts[i], k}));
            if (with_bias) b_views.push_back(b[i].tensor({parts[i]}));
          }
          std::vector<float> got(static_cast<std::size_t>(m * width), NAN);
          be->gemm_parts(view(got, {m, width}), view(a, {m, k}), wt_views, b_views);
          std::vector<double> want(got.size());
          std::vector<double> mag(got.size());
          std::int64_t col = 0;
          for (std::size_t i = 0; i < parts.size(); ++i) {
            for (std::int64_t r = 0; r < m; ++r)
              for (std::int64_t j = 0; j < parts[i]; ++j) {
                double s = with_bias ? b[i].values[static_cast<std::size_t>(j)] : 0.0, s_abs = 1.0;
                for (std::int64_t kk = 0; kk < k; ++kk) {
                  const double p = a[static_cast<std::size_t>(r * k + kk)] *
                                   static_cast<double>(w[i].values[static_cast<std::size_t>(j * k + kk)]);
                  s += p;
                  s_abs += std::abs(p);
                }
                const auto o = static_cast<std::size_t>(r * width + col + j);
                want[o] = s;
                mag[o] = s_abs;
              }
            col += parts[i];
          }
          for (std::size_t o = 0; o < got.size(); ++o) {
            INFO("element " << o << " got " << got[o] << " want " << want[o]);
            REQUIRE(std::abs(got[o] - want[o]) <= 2e-6 * mag[o]);
          }
        }
      }
    }
  }
}

// A decode GEMV large enough to be split (guided pieces claimed by 4 threads, run_gemv) writes
// the bits one thread does: pieces are whole 16-column groups, and a column's sum never
// depends on which thread or piece ran it. Parts of gemm_parts whose ends fall inside groups,
// every kernel table and weight dtype, 1 and 3 rows.
TEST_CASE("cpu GEMV split over threads gives one thread's bits, across parts", "[cpu]") {
  std::mt19937 rng(23);
  const std::int64_t k = 256;
  const std::int64_t parts[] = {1000, 290, 310};  // 1.6 MB of f32 weights: ~100 groups
  std::int64_t width = 0;
  for (auto n : parts) width += n;
  for (const auto* kt : cpu::supported_kernels()) {
    CpuBackend one(BackendOptions{1, 0}, kt, false), four(BackendOptions{4, 0}, kt, false);
    for (DType wt : kWeightTypes)
      for (const std::int64_t m : {1, 3}) {
        INFO(kt->isa << " w=" << dtype_name(wt) << " m=" << m);
        auto a = random_floats(rng, static_cast<std::size_t>(m * k));
        std::vector<TypedWeight> w;
        std::vector<Tensor> views;
        for (auto n : parts) w.push_back(make_weight(rng, static_cast<std::size_t>(n * k), wt));
        for (std::size_t i = 0; i < w.size(); ++i) views.push_back(w[i].tensor({parts[i], k}));
        std::vector<float> want(static_cast<std::size_t>(m * width), NAN), got = want;
        one.gemm_parts(view(want, {m, width}), view(a, {m, k}), views, {});
        four.gemm_parts(view(got, {m, width}), view(a, {m, k}), views, {});
        REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        // One weight alone (gemm): the first part's columns.
        std::vector<float> first(static_cast<std::size_t>(m * parts[0]), NAN);
        four.gemm(view(first, {m, parts[0]}), view(a, {m, k}), views[0], WeightLayout::out_in, {});
        for (std::int64_t r = 0; r < m; ++r)
          REQUIRE(std::memcmp(first.data() + r * parts[0], want.data() + r * width,
                              static_cast<std::size_t>(parts[0]) * sizeof(float)) == 0);
      }
  }
}

TEST_CASE("cpu gemm_parts rejects parts that do not fill out and a wrong bias count", "[cpu]") {
  CpuBackend be(BackendOptions{2, 0});
  std::vector<float> a(6), w0(12), w1(6), out(14), bias(4);
  const Tensor ws[] = {view(w0, {4, 3}), view(w1, {2, 3})};
  const Tensor one_bias[] = {view(bias, {4})};
  REQUIRE_NOTHROW(be.gemm_parts(view(out, {2, 6}), view(a, {2, 3}), ws, {}));
  REQUIRE_THROWS_WITH(be.gemm_parts(view(out, {2, 7}), view(a, {2, 3}), ws, {}),
                      Catch::Contains("gemm_parts") && Catch::Contains("6 columns"));
  REQUIRE_THROWS_WITH(be.gemm_parts(view(out, {2, 6}), view(a, {2, 3}), ws, one_bias),
                      Catch::Contains("1 biases for 2 weights"));
  std::vector<float> a_wrong_k(4);
  REQUIRE_THROWS_AS(be.gemm_parts(view(out, {2, 6}), view(a_wrong_k, {2, 2}), ws, {}), Error);
}

TEST_CASE("cpu XSERV_CPU_GEMV_PREFETCH values parse to the L1 and L2 prefetch they name", "[cpu]") {
  using cpu::GemvPrefetch;
  const GemvPrefetch fallback{false, 12345};
  REQUIRE(cpu::parse_gemv_prefetch(nullptr, fallback) == fallback);
  REQUIRE(cpu::parse_gemv_prefetch("l1", fallback) == GemvPrefetch{true, 0});
  REQUIRE(cpu::parse_gemv_prefetch("off", fallback) == GemvPrefetch{false, 0});
  REQUIRE(cpu::parse_gemv_prefetch("l2", fallback) == GemvPrefetch{false, 32 * 1024});
  REQUIRE(cpu::parse_gemv_prefetch("l2:16", fallback) == GemvPrefetch{false, 16 * 1024});
  REQUIRE(cpu::parse_gemv_prefetch("both", fallback) == GemvPrefetch{true, 32 * 1024});
  REQUIRE(cpu::parse_gemv_prefetch("both:64", fallback) == GemvPrefetch{true, 64 * 1024});
  for (const char* bad : {"", "l3", "both:0", "l2:-4", "l2x", "bothx:8", "L1"})
    REQUIRE(cpu::parse_gemv_prefetch(bad, fallback) == fallback);
}

TEST_CASE("cpu prefill GEMM split: whole tiles of 32 to 128 columns, row blocks only when needed",
          "[cpu]") {
  for (std::int64_t threads : {1, 2, 3, 8, 16})
    for (std::int64_t m : {9, 96, 128, 512})
      for (std::int64_t n : {5, 100, 768, 1024, 2304, 3072, 151936}) {
        const cpu::GemmSplit s = cpu::split_gemm(m, n, threads);
        INFO("threads " << threads << " m " << m << " n " << n << ": tile " << s.tile_n
                        << " row blocks " << s.row_blocks);
        REQUIRE((s.tile_n % 32 == 0 && s.tile_n >= 32 && s.tile_n <= 128));
        REQUIRE((s.row_blocks >= 1 && (s.row_blocks == 1 || m / s.row_blocks >= 48)));
        const std::int64_t col_tiles = (n + s.tile_n - 1) / s.tile_n;
        // Column tiles that share out evenly never get row blocks (the weights are packed once).
        if (col_tiles % threads == 0) REQUIRE(s.row_blocks == 1);
      }
  // GPT-2's 768-wide GEMMs of a 128-token prompt at 8 threads: 3 tiles of 32 per thread.
  const cpu::GemmSplit g = cpu::split_gemm(128, 768, 8);
  REQUIRE((g.tile_n == 32 && g.row_blocks == 1));
  // Panels multiplied in place: one panel per task, row blocks where tiles do not share out.
  for (const auto& [m, n, threads, rb] : {std::array<std::int64_t, 4>{128, 768, 8, 1},
                                          {128, 2304, 8, 1}, {128, 768, 2, 1}, {128, 768, 16, 2}}) {
    const cpu::GemmSplit p = cpu::split_gemm(m, n, threads, false);
    INFO("panels, threads " << threads << " n " << n);
    REQUIRE((p.tile_n == 32 && p.row_blocks == rb));
  }
}

TEST_CASE("cpu gemm rejects mismatched shapes and dtypes", "[cpu]") {
  CpuBackend be(BackendOptions{2, 0});
  std::vector<float> a(6), w(12), out(8);
  REQUIRE_THROWS_AS(be.gemm(view(out, {2, 4}), view(a, {2, 3}), view(w, {4, 3}),
                            WeightLayout::in_out, Tensor{}),
                    Error);
  REQUIRE_THROWS_WITH(be.gemm(view(out, {2, 4}), view(a, {2, 3}), view(w, {4, 3}),
                              WeightLayout::in_out, Tensor{}),
                      Catch::Contains("gemm") && Catch::Contains("[2, 3]"));
  REQUIRE_NOTHROW(be.gemm(view(out, {2, 4}), view(a, {2, 3}), view(w, {4, 3}),
                          WeightLayout::out_in, Tensor{}));
  std::vector<std::int32_t> ai(6);
  REQUIRE_THROWS_AS(be.gemm(view(out, {2, 4}), view(ai, {2, 3}), view(w, {4, 3}),
                            WeightLayout::out_in, Tensor{}),
                    Error);
}

TEST_CASE("cpu transpose of 2- and 4-byte weights, and its refusals", "[cpu]") {
  CpuBackend be(BackendOptions{1, 0});
  for (auto [k, n] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {33, 70}, {64, 31}, {5, 128}}) {
    INFO("k=" << k << " n=" << n);
    std::vector<float> w(static_cast<std::size_t>(k * n)), out(w.size());
    std::iota(w.begin(), w.end(), 0.0f);
    be.transpose(view(out, {n, k}), view(w, {k, n}));
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < n; ++j) REQUIRE(out[static_cast<std::size_t>(j * k + i)] == w[static_cast<std::size_t>(i * n + j)]);
    std::vector<std::uint16_t> h(w.size()), ht(w.size());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(i * 7);
    be.transpose(Tensor(ht.data(), DType::bf16, Shape{n, k}), Tensor(h.data(), DType::bf16, Shape{k, n}));
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < n; ++j) REQUIRE(ht[static_cast<std::size_t>(j * k + i)] == h[static_cast<std::size_t>(i * n + j)]);
  }
  std::vector<float> w(12), out(12);
  REQUIRE_THROWS_WITH(be.transpose(view(out, {3, 4}), view(w, {3, 4})), Catch::Contains("transpose"));
  std::vector<std::int32_t> wi(12);
  REQUIRE_THROWS_AS(be.transpose(view(out, {4, 3}), view(wi, {3, 4})), Error);
}

TEST_CASE("cpu layer_norm and rms_norm, with and without the fused residual", "[cpu]") {
  std::mt19937 rng(2);
  CpuBackend be(BackendOptions{3, 0});
  for (std::int64_t d : {1, 7, 64, 333}) {
    for (DType wt : kWeightTypes) {
      for (bool fused : {false, true}) {
        for (bool rms : {false, true}) {
          INFO("d=" << d << " w=" << dtype_name(wt) << " fused=" << fused << " rms=" << rms);
          const std::int64_t rows = 5;
          auto x = random_floats(rng, static_cast<std::size_t>(rows * d), -2.0f, 3.0f);
          auto res = random_floats(rng, x.size());
          auto w = make_weight(rng, static_cast<std::size_t>(d), wt);
          auto b = make_weight(rng, static_cast<std::size_t>(d), wt);
          const float eps = 1e-5f;
          std::vector<double> want(x.size()), want_res(x.size());
          for (std::int64_t r = 0; r < rows; ++r) {
            std::vector<double> v(static_cast<std::size_t>(d));
            for (std::int64_t i = 0; i < d; ++i) {
              const auto o = static_cast<std::size_t>(r * d + i);
              v[static_cast<std::size_t>(i)] = fused ? static_cast<double>(res[o] + x[o]) : x[o];
              want_res[o] = v[static_cast<std::size_t>(i)];
            }
            double mean = 0.0, var = 0.0, ss = 0.0;
            for (double e : v) mean += e, ss += e * e;
            mean /= static_cast<double>(d);
            for (double e : v) var += (e - mean) * (e - mean);
            var /= static_cast<double>(d);
            ss /= static_cast<double>(d);
            for (std::int64_t i = 0; i < d; ++i) {
              const auto o = static_cast<std::size_t>(r * d + i);
              const double e = v[static_cast<std::size_t>(i)];
              const double wv = w.values[static_cast<std::size_t>(i)];
              want[o] = rms ? e / std::sqrt(ss + eps) * wv
                            : (e - mean) / std::sqrt(var + eps) * wv + b.values[static_cast<std::size_t>(i)];
            }
          }
          std::vector<float> out(x.size(), NAN);
          auto res_got = res;
          Tensor rt = fused ? view(res_got, {rows, d}) : Tensor{};
          if (rms)
            be.rms_norm(view(out, {rows, d}), view(x, {rows, d}), rt, w.tensor({d}), eps);
          else
            be.layer_norm(view(out, {rows, d}), view(x, {rows, d}), rt, w.tensor({d}),
                          b.tensor({d}), eps);
          require_close(out, want, 1e-5, 1e-5);
          if (fused) require_close(res_got, want_res, 0.0, 0.0);
        }
      }
    }
  }
  std::vector<float> x(12), out(12), w(5);
  REQUIRE_THROWS_WITH(be.rms_norm(view(out, {3, 4}), view(x, {3, 4}), Tensor{}, view(w, {5}), 1e-6f),
                      Catch::Contains("rms_norm"));
}

TEST_CASE("cpu embedding with and without learned positions", "[cpu]") {
  std::mt19937 rng(3);
  CpuBackend be(BackendOptions{2, 0});
  const std::int64_t vocab = 37, d = 19, n_pos = 11, t = 9;
  for (DType wt : kWeightTypes) {
    auto table = make_weight(rng, static_cast<std::size_t>(vocab * d), wt);
    auto pos_table = make_weight(rng, static_cast<std::size_t>(n_pos * d), wt);
    std::vector<std::int32_t> ids(t), pos(t);
    for (std::int64_t i = 0; i < t; ++i) {
      ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(rng() % vocab);
      pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(rng() % n_pos);
    }
    for (bool with_pos : {false, true}) {
      std::vector<float> out(static_cast<std::size_t>(t * d), NAN);
      be.embedding(view(out, {t, d}), view(ids, {t}), table.tensor({vocab, d}),
                   with_pos ? pos_table.tensor({n_pos, d}) : Tensor{},
                   with_pos ? view(pos, {t}) : Tensor{});
      std::vector<double> want(out.size());
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < d; ++j)
          want[static_cast<std::size_t>(i * d + j)] =
              static_cast<double>(table.values[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)] * d + j)]) +
              (with_pos ? pos_table.values[static_cast<std::size_t>(pos[static_cast<std::size_t>(i)] * d + j)] : 0.0f);
      require_close(out, want, 1e-6, 1e-6);
    }
    ids[4] = static_cast<std::int32_t>(vocab);
    std::vector<float> out(static_cast<std::size_t>(t * d));
    REQUIRE_THROWS_AS(be.embedding(view(out, {t, d}), view(ids, {t}), table.tensor({vocab, d}),
                                   Tensor{}, Tensor{}),
                      Error);
  }
}

// Backend::rms_norm_mlp (a pre-norm block's SwiGLU MLP with its residual): the CPU does not fuse
// it, and its result is x + swiglu(RMSNorm(x) * g . W_gate_up^T) . W_down^T, as a double
// reference computes it, bit for bit the ops it is made of.
TEST_CASE("cpu rms_norm_mlp: a SwiGLU MLP block with its residual, as its ops", "[cpu]") {
  std::mt19937 rng(16);
  CpuBackend be(BackendOptions{2, 0});
  const std::int64_t t = 3, n = 24, inter = 20;
  const auto x0 = random_floats(rng, static_cast<std::size_t>(t * n), -2.0f, 2.0f);
  auto g = random_floats(rng, static_cast<std::size_t>(n), 0.5f, 1.5f);
  auto wgu = random_floats(rng, static_cast<std::size_t>(2 * inter * n), -0.3f, 0.3f);
  auto wd = random_floats(rng, static_cast<std::size_t>(n * inter), -0.3f, 0.3f);
  auto x = x0;
  std::vector<float> act(static_cast<std::size_t>(t * inter)), h(x.size()),
      y(static_cast<std::size_t>(t * 2 * inter));
  const Tensor gu_w = view(wgu, {2 * inter, n}), down_w = view(wd, {n, inter});
  REQUIRE_FALSE(be.fuses_rms_norm_mlp(view(x, {t, n}), gu_w, down_w));
  be.rms_norm_mlp(view(x, {t, n}), view(g, {n}), 1e-6f, gu_w, down_w, view(act, {t, inter}),
                  view(h, {t, n}), view(y, {t, 2 * inter}));
  std::vector<double> want(x.size());
  const auto N = static_cast<std::size_t>(n), I = static_cast<std::size_t>(inter);
  for (std::size_t r = 0; r < static_cast<std::size_t>(t); ++r) {
    const float* xr = x0.data() + r * N;
    double ss = 0;
    for (std::size_t i = 0; i < N; ++i) ss += double{xr[i]} * xr[i];
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
    std::vector<double> hn(N), a(I);
    for (std::size_t i = 0; i < N; ++i) hn[i] = xr[i] * rstd * g[i];
    for (std::size_t j = 0; j < I; ++j) {
      double gate = 0, up = 0;
      for (std::size_t i = 0; i < N; ++i) {
        gate += wgu[j * N + i] * hn[i];
        up += wgu[(I + j) * N + i] * hn[i];
      }
      a[j] = gate / (1.0 + std::exp(-gate)) * up;
    }
    for (std::size_t o = 0; o < N; ++o) {
      double sum = xr[o];
      for (std::size_t j = 0; j < I; ++j) sum += wd[o * I + j] * a[j];
      want[r * N + o] = sum;
    }
  }
  require_close(x, want, 1e-5, 1e-5);
  // The same ops one by one.
  auto x2 = x0;
  std::vector<float> act2(act.size()), h2(h.size()), y2(y.size());
  be.rms_norm_gemm(view(act2, {t, inter}), view(x2, {t, n}), view(g, {n}), 1e-6f, gu_w, true,
                   view(h2, {t, n}), view(y2, {t, 2 * inter}));
  be.gemm(view(x2, {t, n}), view(act2, {t, inter}), down_w, WeightLayout::out_in, {}, 1.0f);
  REQUIRE(x2 == x);
}

TEST_CASE("cpu gelu, swiglu and gather_rows", "[cpu]") {
  std::mt19937 rng(4);
  CpuBackend be(BackendOptions{2, 0});
  auto x = random_floats(rng, 10001, -6.0f, 6.0f);
  const float extremes[] = {-100.0f, 100.0f, 0.0f, -30.0f, 1e-20f, -1e-20f, 30.0f, -9.0f};
  std::copy(std::begin(extremes), std::end(extremes), x.begin() + 40);  // inside a vector run
  auto y = x;
  be.gelu(view(y, {10001}));
  std::vector<double> want(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) want[i] = gelu_tanh(x[i]);
  require_close(y, want, 1e-6, 1e-5);

  const std::int64_t t = 7, inter = 13;
  auto gu = random_floats(rng, static_cast<std::size_t>(t * 2 * inter), -5.0f, 5.0f);
  gu[0] = -100.0f;
  gu[1] = 100.0f;
  gu[2] = 90.0f;
  std::vector<float> out(static_cast<std::size_t>(t * inter));
  be.swiglu(view(out, {t, inter}), view(gu, {t, 2 * inter}));
  std::vector<double> want_s(out.size());
  for (std::int64_t r = 0; r < t; ++r)
    for (std::int64_t i = 0; i < inter; ++i) {
      const double g = gu[static_cast<std::size_t>(r * 2 * inter + i)];
      const double u = gu[static_cast<std::size_t>(r * 2 * inter + inter + i)];
      want_s[static_cast<std::size_t>(r * inter + i)] = g / (1.0 + std::exp(-g)) * u;
    }
  require_close(out, want_s, 1e-6, 1e-5);

  std::vector<std::int32_t> rows{0, 3, 6};
  std::vector<float> g(3 * 2 * inter);
  be.gather_rows(view(g, {3, 2 * inter}), view(gu, {t, 2 * inter}), view(rows, {3}));
  for (std::size_t r = 0; r < 3; ++r)
    for (std::int64_t i = 0; i < 2 * inter; ++i)
      REQUIRE(g[r * 2 * inter + static_cast<std::size_t>(i)] ==
              gu[static_cast<std::size_t>(rows[r]) * 2 * inter + static_cast<std::size_t>(i)]);
  rows[2] = 7;
  REQUIRE_THROWS_AS(be.gather_rows(view(g, {3, 2 * inter}), view(gu, {t, 2 * inter}), view(rows, {3})),
                    Error);
}

namespace {

// A paged batch of several sequences: random context and query lengths, every context token's
// K/V in the cache at a slot of a shuffled block table.
struct PagedCase {
  HeadGeometry heads;
  std::int32_t block_size = 0, num_blocks = 0;
  ForwardBatch batch;
  std::vector<float> k_cache, v_cache, qkv;
  // Reference K/V per sequence and position: [seq][pos][kv_head][d].
  std::vector<std::vector<float>> ref_k, ref_v;
  std::vector<std::int32_t> row_seq;

  KvLayer cache() {
    const Shape s{num_blocks, block_size, heads.n_kv_heads, heads.head_dim};
    return KvLayer{Tensor(k_cache.data(), DType::f32, s), Tensor(v_cache.data(), DType::f32, s)};
  }
};

PagedCase make_paged(std::mt19937& rng, HeadGeometry heads, std::int32_t block_size,
                     const std::vector<std::pair<std::int32_t, std::int32_t>>& ctx_query) {
  PagedCase c;
  c.heads = heads;
  c.block_size = block_size;
  const auto s_count = static_cast<std::int32_t>(ctx_query.size());
  std::int32_t max_blocks = 0, total_blocks = 0;
  for (auto [ctx, q] : ctx_query) {
    max_blocks = std::max(max_blocks, (ctx + block_size - 1) / block_size);
    total_blocks += (ctx + block_size - 1) / block_size;
  }
  c.num_blocks = total_blocks + 3;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(c.num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::int64_t kv_row = static_cast<std::int64_t>(heads.n_kv_heads) * heads.head_dim;
  c.k_cache = random_floats(rng, static_cast<std::size_t>(c.num_blocks * block_size * kv_row));
  c.v_cache = random_floats(rng, c.k_cache.size());
  auto& b = c.batch;
  b.max_blocks_per_seq = max_blocks;
  b.block_tables.assign(static_cast<std::size_t>(s_count * max_blocks), 0);
  b.query_start.push_back(0);
  std::size_t next_block = 0;
  for (std::int32_t s = 0; s < s_count; ++s) {
    auto [ctx, q] = ctx_query[static_cast<std::size_t>(s)];
    for (std::int32_t j = 0; j < (ctx + block_size - 1) / block_size; ++j)
      b.block_tables[static_cast<std::size_t>(s * max_blocks + j)] = perm[next_block++];
    c.ref_k.emplace_back(static_cast<std::size_t>(ctx * kv_row));
    c.ref_v.emplace_back(static_cast<std::size_t>(ctx * kv_row));
    for (std::int32_t p = 0; p < ctx; ++p) {
      const std::int32_t slot =
          b.block_tables[static_cast<std::size_t>(s * max_blocks + p / block_size)] * block_size +
          p % block_size;
      std::copy_n(c.k_cache.begin() + slot * kv_row, kv_row, c.ref_k.back().begin() + p * kv_row);
      std::copy_n(c.v_cache.begin() + slot * kv_row, kv_row, c.ref_v.back().begin() + p * kv_row);
      if (p >= ctx - q) {
        b.token_ids.push_back(0);
        b.positions.push_back(p);
        b.slot_mapping.push_back(slot);
        c.row_seq.push_back(s);
      }
    }
    b.query_start.push_back(static_cast<std::int32_t>(b.positions.size()));
    b.context_lens.push_back(ctx);
  }
  c.qkv = random_floats(rng, b.positions.size() * static_cast<std::size_t>(heads.qkv_width()));
  b.validate(block_size);
  return c;
}

// Causal attention of every row of c in double: the row at position p over keys 0..p.
std::vector<double> naive_attention(const PagedCase& c, float scale) {
  const HeadGeometry& geom = c.heads;
  const std::int64_t t = c.batch.num_tokens(), d = geom.head_dim;
  std::vector<double> want(static_cast<std::size_t>(t * geom.n_q_heads * d));
  const std::int32_t group = geom.n_q_heads / geom.n_kv_heads;
  for (std::int64_t r = 0; r < t; ++r) {
    const auto s = static_cast<std::size_t>(c.row_seq[static_cast<std::size_t>(r)]);
    const std::int32_t p = c.batch.positions[static_cast<std::size_t>(r)];
    for (std::int32_t h = 0; h < geom.n_q_heads; ++h) {
      const float* q = c.qkv.data() + r * geom.qkv_width() + h * d;
      const std::int32_t kvh = h / group;
      std::vector<double> sc(static_cast<std::size_t>(p + 1));
      double mx = -1e300;
      for (std::int32_t j = 0; j <= p; ++j) {
        const float* k = c.ref_k[s].data() + (j * geom.n_kv_heads + kvh) * d;
        double dot = 0.0;
        for (std::int64_t i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[i];
        sc[static_cast<std::size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      double sum = 0.0;
      for (auto& e : sc) sum += (e = std::exp(e - mx));
      for (std::int64_t i = 0; i < d; ++i) {
        double acc = 0.0;
        for (std::int32_t j = 0; j <= p; ++j)
          acc += sc[static_cast<std::size_t>(j)] *
                 c.ref_v[s][static_cast<std::size_t>((j * geom.n_kv_heads + kvh) * d + i)];
        want[static_cast<std::size_t>(r * geom.n_q_heads * d + h * d + i)] = acc / sum;
      }
    }
  }
  return want;
}

}  // namespace

// GQA groups of 1, 2, 3, 4 and 8 q heads: a decode row's kernel takes 4 (AVX-512) or 2 heads of a
// group at once, in one or several passes, or one at a time for an odd group. Prefill rows run
// in tiles of SIMD lanes (16 rows with AVX2 or AVX-512, 8 generic), a last tile at least half
// full among them (12, 37 and 140 rows, after 0, 8 and 10 cached keys), the rest in the
// row-major kernel.
TEST_CASE("cpu paged attention matches a naive causal reference", "[cpu]") {
  std::mt19937 rng(5);
  const HeadGeometry geoms[] = {{4, 4, 64}, {4, 2, 128}, {8, 2, 33}, {4, 1, 7}, {6, 2, 16}, {16, 2, 32}};
  const std::vector<std::pair<std::int32_t, std::int32_t>> seqs = {
      {19, 19}, {1, 1}, {40, 1}, {23, 6}, {16, 16}, {9, 1}, {30, 12}, {45, 37}, {150, 140}};
  for (auto& be : every_backend()) {
    for (const auto& geom : geoms) {
      for (std::int32_t bs : {4, 16}) {
        INFO(be->name() << " heads " << geom.n_q_heads << "/" << geom.n_kv_heads << " d "
                        << geom.head_dim << " block " << bs);
        auto c = make_paged(rng, geom, bs, seqs);
        const std::int64_t t = c.batch.num_tokens(), d = geom.head_dim;
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        std::vector<float> out(static_cast<std::size_t>(t * geom.n_q_heads * d), NAN);
        const DeviceBatch db = be->upload_batch(c.batch);
        be->attention(view(out, {t, geom.n_q_heads * d}), view(c.qkv, {t, geom.qkv_width()}),
                      geom, db, c.cache(), scale);
        const std::vector<double> want = naive_attention(c, scale);
        require_close(out, want, 2e-6, 1e-5);
      }
    }
  }
}

// Decode rows past 512 keys (attention_part_keys) run as key parts merged after: within the
// naive reference's tolerance, and a row's bits do not depend on the rows decoded beside it or
// on the thread count (the parts follow its key count alone; threads only split them further
// into kv-head ranges, which changes no sum).
TEST_CASE("cpu decode attention over long contexts in key parts", "[cpu]") {
  std::mt19937 rng(9);
  const HeadGeometry geoms[] = {{16, 8, 64}, {8, 2, 33}, {4, 4, 16}};
  const std::vector<std::pair<std::int32_t, std::int32_t>> seqs = {
      {1100, 1}, {512, 1}, {513, 1}, {700, 3}, {2049, 1}};
  for (const auto& geom : geoms) {
    auto c = make_paged(rng, geom, 16, seqs);
    // Scaled up so that the parts' maxima differ and the merge's rescale matters.
    for (auto& x : c.qkv) x *= 4.0f;
    const std::int64_t t = c.batch.num_tokens(), q_width = std::int64_t{geom.n_q_heads} * geom.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(geom.head_dim));
    const std::vector<double> want = naive_attention(c, scale);
    std::vector<std::vector<float>> first;  // per kernel table, at the first thread count
    for (std::size_t threads : {std::size_t{3}, std::size_t{1}, std::size_t{2}}) {
      auto backends = every_backend(threads);
      first.resize(backends.size());
      for (std::size_t i = 0; i < backends.size(); ++i) {
        auto& be = backends[i];
        INFO(be->name() << " threads " << threads << " heads " << geom.n_q_heads << "/"
                        << geom.n_kv_heads << " d " << geom.head_dim);
        std::vector<float> out(static_cast<std::size_t>(t * q_width), NAN);
        const DeviceBatch db = be->upload_batch(c.batch);
        be->attention(view(out, {t, q_width}), view(c.qkv, {t, geom.qkv_width()}), geom, db,
                      c.cache(), scale);
        require_close(out, want, 2e-6, 1e-5);
        if (first[i].empty()) first[i] = out;
        else REQUIRE(out == first[i]);  // the same bits at any thread count
      }
    }
    // The 2049-key row (the last) alone gives the bits it gave beside the others.
    ForwardBatch b;
    const std::size_t last = c.batch.context_lens.size() - 1;
    const auto mb = static_cast<std::size_t>(c.batch.max_blocks_per_seq);
    b.token_ids = {0};
    b.positions = {c.batch.positions.back()};
    b.slot_mapping = {c.batch.slot_mapping.back()};
    b.query_start = {0, 1};
    b.context_lens = {c.batch.context_lens[last]};
    b.max_blocks_per_seq = c.batch.max_blocks_per_seq;
    b.block_tables.assign(c.batch.block_tables.begin() + static_cast<std::ptrdiff_t>(last * mb),
                          c.batch.block_tables.begin() + static_cast<std::ptrdiff_t>((last + 1) * mb));
    std::vector<float> qrow(c.qkv.end() - geom.qkv_width(), c.qkv.end()), one(static_cast<std::size_t>(q_width));
    CpuBackend be(BackendOptions{3, 0});
    be.attention(view(one, {1, q_width}), view(qrow, {1, geom.qkv_width()}), geom, be.upload_batch(b),
                 c.cache(), scale);
    REQUIRE(std::equal(one.begin(), one.end(), first.back().end() - q_width));

    // One 1100-key row (3 parts) at 8 threads: more threads than parts, so each part is also
    // split into kv-head ranges; the bits of 1 thread, within the reference's tolerance.
    auto c1 = make_paged(rng, geom, 16, {{1100, 1}});
    for (auto& x : c1.qkv) x *= 4.0f;
    const std::vector<double> want1 = naive_attention(c1, scale);
    std::vector<float> by_threads[2];
    for (int k = 0; k < 2; ++k) {
      CpuBackend b1(BackendOptions{k == 0 ? std::size_t{1} : std::size_t{8}, 0});
      by_threads[k].assign(static_cast<std::size_t>(q_width), NAN);
      b1.attention(view(by_threads[k], {1, q_width}), view(c1.qkv, {1, geom.qkv_width()}), geom,
                   b1.upload_batch(c1.batch), c1.cache(), scale);
      require_close(by_threads[k], want1, 2e-6, 1e-5);
    }
    REQUIRE(by_threads[0] == by_threads[1]);
  }
  // A batch of no rows (no blocks, no parts) is nothing to do, not a division by zero.
  const HeadGeometry geom{16, 8, 64};
  auto c = make_paged(rng, geom, 16, {{1100, 1}});
  ForwardBatch none;
  none.query_start = {0};
  none.max_blocks_per_seq = 1;
  CpuBackend be(BackendOptions{2, 0});
  std::vector<float> qkv0, out0;
  REQUIRE_NOTHROW(be.attention(view(out0, {0, std::int64_t{16} * 64}), view(qkv0, {0, geom.qkv_width()}), geom,
                               be.upload_batch(none), c.cache(), 0.125f));
}

// XSERV_CPU_KV=bf16's cache: the kernels widen each bf16 element exactly to f32, so attention over
// a bf16 cache gives the bits of attention over an f32 cache holding the same (rounded) values,
// for every kernel table and head shape of whole registers (head_dim 7 and 33, which take the
// scalar tails, within 1e-6); and
// qk_transform_store writes each K/V element rounded to nearest even. A cache of mixed dtypes
// is refused.
TEST_CASE("cpu attention over a bf16 cache equals the f32 cache of the same values", "[cpu]") {
  std::mt19937 rng(17);
  const HeadGeometry geoms[] = {{16, 8, 128}, {4, 2, 64}, {8, 2, 33}, {4, 1, 7}};
  const std::vector<std::pair<std::int32_t, std::int32_t>> seqs = {{37, 37}, {1, 1}, {70, 1}, {23, 6}};
  for (auto& be : every_backend()) {
    for (const auto& geom : geoms) {
      INFO(be->name() << " heads " << geom.n_q_heads << "/" << geom.n_kv_heads << " d " << geom.head_dim);
      auto c = make_paged(rng, geom, 16, seqs);
      std::vector<std::uint16_t> kh(c.k_cache.size()), vh(c.v_cache.size());
      for (std::size_t i = 0; i < kh.size(); ++i) {
        kh[i] = f32_to_bf16(c.k_cache[i]);
        vh[i] = f32_to_bf16(c.v_cache[i]);
        c.k_cache[i] = bf16_to_f32(kh[i]);
        c.v_cache[i] = bf16_to_f32(vh[i]);
      }
      const Shape cs{c.num_blocks, c.block_size, geom.n_kv_heads, geom.head_dim};
      const KvLayer bf16_cache{Tensor(kh.data(), DType::bf16, cs), Tensor(vh.data(), DType::bf16, cs)};
      const std::int64_t t = c.batch.num_tokens(), q_width = std::int64_t{geom.n_q_heads} * geom.head_dim;
      const DeviceBatch db = be->upload_batch(c.batch);
      std::vector<float> want(static_cast<std::size_t>(t * q_width), NAN), got(want.size(), NAN);
      be->attention(view(want, {t, q_width}), view(c.qkv, {t, geom.qkv_width()}), geom, db, c.cache(), 0.3f);
      be->attention(view(got, {t, q_width}), view(c.qkv, {t, geom.qkv_width()}), geom, db, bf16_cache, 0.3f);
      if (geom.head_dim % 16 == 0) {
        REQUIRE(got == want);
      } else {
        // Past the last whole register the scalar tails may fuse a multiply-add differently in
        // the two instantiations (AVX2, head_dim 33: 174 of 11880 values 1 ulp apart).
        for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-6));
      }

      // The transform's store: the same rows into an f32 and a bf16 cache.
      QkTransform tr;
      tr.rope = geom.head_dim % 2 == 0;
      auto row_f32 = c.qkv, row_bf16 = c.qkv;
      be->qk_transform_store(view(row_f32, {t, geom.qkv_width()}), geom, tr, db, c.cache());
      be->qk_transform_store(view(row_bf16, {t, geom.qkv_width()}), geom, tr, db, bf16_cache);
      REQUIRE(row_bf16 == row_f32);  // q, k and v as transformed, whatever the cache
      for (std::size_t i = 0; i < kh.size(); ++i) {
        REQUIRE(kh[i] == f32_to_bf16(c.k_cache[i]));
        REQUIRE(vh[i] == f32_to_bf16(c.v_cache[i]));
      }
      const KvLayer mixed{c.cache().k, bf16_cache.v};
      REQUIRE_THROWS_AS(be->attention(view(got, {t, q_width}), view(c.qkv, {t, geom.qkv_width()}), geom,
                                      db, mixed, 0.3f),
                        Error);
    }
  }
}

TEST_CASE("cpu attention rejects block tables and positions outside the cache", "[cpu]") {
  std::mt19937 rng(6);
  CpuBackend be(BackendOptions{2, 0});
  const HeadGeometry geom{2, 1, 8};
  auto c = make_paged(rng, geom, 4, {{6, 2}});
  std::vector<float> out(static_cast<std::size_t>(2 * 16));
  c.batch.block_tables[1] = c.num_blocks;
  REQUIRE_THROWS_WITH(be.attention(view(out, {2, 16}), view(c.qkv, {2, geom.qkv_width()}), geom,
                                   be.upload_batch(c.batch), c.cache(), 1.0f),
                      Catch::Contains("attention"));
  c.batch.block_tables[1] = 0;
  c.batch.positions[1] = 6;
  REQUIRE_THROWS_AS(be.attention(view(out, {2, 16}), view(c.qkv, {2, geom.qkv_width()}), geom,
                                 be.upload_batch(c.batch), c.cache(), 1.0f),
                    Error);
}

TEST_CASE("cpu qk_transform_store: per-head RMSNorm, neox RoPE, K/V into cache slots", "[cpu]") {
  std::mt19937 rng(7);
  struct Case {
    HeadGeometry geom;
    bool norm, rope;
  };
  const Case cases[] = {{{4, 4, 64}, true, true},   {{4, 2, 128}, true, true},
                        {{8, 2, 64}, false, true},  {{4, 1, 5}, true, false},
                        {{2, 2, 16}, false, false}};
  CpuBackend be(BackendOptions{3, 0});
  for (const auto& cs : cases) {
    for (DType wt : kWeightTypes) {
      const auto& g = cs.geom;
      INFO("heads " << g.n_q_heads << "/" << g.n_kv_heads << " d " << g.head_dim << " norm "
                    << cs.norm << " rope " << cs.rope << " w " << dtype_name(wt));
      auto c = make_paged(rng, g, 8, {{13, 13}, {30, 1}, {20, 5}});
      std::fill(c.k_cache.begin(), c.k_cache.end(), NAN);
      std::fill(c.v_cache.begin(), c.v_cache.end(), NAN);
      const std::int64_t d = g.head_dim, t = c.batch.num_tokens(), width = g.qkv_width();
      auto qn = make_weight(rng, static_cast<std::size_t>(d), wt, 0.5f, 1.5f);
      auto kn = make_weight(rng, static_cast<std::size_t>(d), wt, 0.5f, 1.5f);
      QkTransform tr;
      if (cs.norm) {
        tr.q_norm = qn.tensor({d});
        tr.k_norm = kn.tensor({d});
      }
      tr.norm_eps = 1e-6f;
      tr.rope = cs.rope;
      tr.rope_theta = 1000000.0f;
      // Reference: double arithmetic on the same f32 angles HF computes.
      std::vector<double> want(c.qkv.size());
      for (std::int64_t r = 0; r < t; ++r) {
        const float pos = static_cast<float>(c.batch.positions[static_cast<std::size_t>(r)]);
        for (std::int32_t h = 0; h < g.n_q_heads + 2 * g.n_kv_heads; ++h) {
          std::vector<double> x(static_cast<std::size_t>(d));
          for (std::int64_t i = 0; i < d; ++i) x[static_cast<std::size_t>(i)] = c.qkv[static_cast<std::size_t>(r * width + h * d + i)];
          const bool is_v = h >= g.n_q_heads + g.n_kv_heads;
          if (!is_v && cs.norm) {
            double ss = 0.0;
            for (double e : x) ss += e * e;
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
            const auto& w = h < g.n_q_heads ? qn.values : kn.values;
            for (std::int64_t i = 0; i < d; ++i) x[static_cast<std::size_t>(i)] *= inv * w[static_cast<std::size_t>(i)];
          }
          if (!is_v && cs.rope) {
            const std::int64_t half = d / 2;
            std::vector<double> y = x;
            for (std::int64_t i = 0; i < half; ++i) {
              const float inv_freq = 1.0f / std::pow(1000000.0f, static_cast<float>(2 * i) / static_cast<float>(d));
              const double ang = static_cast<double>(pos * inv_freq);
              const double co = std::cos(ang), si = std::sin(ang);
              y[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] * co - x[static_cast<std::size_t>(i + half)] * si;
              y[static_cast<std::size_t>(i + half)] = x[static_cast<std::size_t>(i + half)] * co + x[static_cast<std::size_t>(i)] * si;
            }
            x = y;
          }
          for (std::int64_t i = 0; i < d; ++i) want[static_cast<std::size_t>(r * width + h * d + i)] = x[static_cast<std::size_t>(i)];
        }
      }
      auto got = c.qkv;
      be.qk_transform_store(view(got, {t, width}), g, tr, be.upload_batch(c.batch), c.cache());
      require_close(got, want, 2e-5, 2e-5);
      // K and V of every row sit at its slot, exactly as left in qkv.
      const std::int64_t kv_row = static_cast<std::int64_t>(g.n_kv_heads) * d;
      for (std::int64_t r = 0; r < t; ++r) {
        const std::int64_t slot = c.batch.slot_mapping[static_cast<std::size_t>(r)];
        for (std::int64_t i = 0; i < kv_row; ++i) {
          REQUIRE(c.k_cache[static_cast<std::size_t>(slot * kv_row + i)] ==
                  got[static_cast<std::size_t>(r * width + g.n_q_heads * d + i)]);
          REQUIRE(c.v_cache[static_cast<std::size_t>(slot * kv_row + i)] ==
                  got[static_cast<std::size_t>(r * width + g.n_q_heads * d + kv_row + i)]);
        }
      }
    }
  }
}

TEST_CASE("cpu qk_transform_store one-row calls: the kept RoPE table follows position, head size and theta", "[cpu]") {
  // One backend keeps inv_freq and the last one-row call's cos/sin (a decode step's layers share
  // a position); each call must equal a fresh backend's, whatever changed since the last.
  std::mt19937 rng(9);
  CpuBackend kept(BackendOptions{2, 0});
  struct Call {
    HeadGeometry geom;
    std::int32_t context;  // the row's position is context - 1
    float theta;
  };
  const Call calls[] = {{{4, 2, 64}, 7, 1e6f},  {{4, 2, 64}, 7, 1e6f},  {{4, 2, 64}, 8, 1e6f},
                        {{4, 2, 32}, 8, 1e6f},  {{4, 2, 32}, 8, 1e4f},  {{4, 2, 32}, 3, 1e4f}};
  for (const Call& call : calls) {
    INFO("d " << call.geom.head_dim << " position " << call.context - 1 << " theta " << call.theta);
    auto c = make_paged(rng, call.geom, 4, {{call.context, 1}});
    QkTransform tr;
    tr.rope = true;
    tr.rope_theta = call.theta;
    const std::int64_t width = call.geom.qkv_width();
    auto got = c.qkv, want = c.qkv;
    kept.qk_transform_store(view(got, {1, width}), call.geom, tr, kept.upload_batch(c.batch), c.cache());
    CpuBackend fresh(BackendOptions{1, 0});
    fresh.qk_transform_store(view(want, {1, width}), call.geom, tr, fresh.upload_batch(c.batch), c.cache());
    REQUIRE(got == want);
  }
}

TEST_CASE("cpu prefill then decode through qk_transform_store and attention", "[cpu]") {
  // The cache written by qk_transform_store is what attention reads: a 2-token decode after a
  // prefill equals one prefill of the whole sequence.
  std::mt19937 rng(8);
  CpuBackend be(BackendOptions{2, 0});
  const HeadGeometry g{4, 2, 16};
  const std::int32_t bs = 4, blocks = 6, total = 11;
  std::vector<float> kc(static_cast<std::size_t>(blocks * bs * 2 * 16)), vc(kc.size());
  const Shape cs{blocks, bs, 2, 16};
  KvLayer cache{Tensor(kc.data(), DType::f32, cs), Tensor(vc.data(), DType::f32, cs)};
  QkTransform tr;
  tr.rope = true;
  auto qkv = random_floats(rng, static_cast<std::size_t>(total * g.qkv_width()));
  auto run = [&](std::int32_t begin, std::int32_t end) {
    ForwardBatch b;
    for (std::int32_t p = begin; p < end; ++p) {
      b.token_ids.push_back(0);
      b.positions.push_back(p);
      b.slot_mapping.push_back(std::array{5, 2, 0}[static_cast<std::size_t>(p / bs)] * bs + p % bs);
    }
    b.query_start = {0, end - begin};
    b.context_lens = {end};
    b.block_tables = {5, 2, 0};
    b.max_blocks_per_seq = 3;
    const auto n = end - begin;
    std::vector<float> part(qkv.begin() + begin * g.qkv_width(), qkv.begin() + end * g.qkv_width());
    const DeviceBatch db = be.upload_batch(b);
    be.qk_transform_store(view(part, {n, g.qkv_width()}), g, tr, db, cache);
    std::vector<float> out(static_cast<std::size_t>(n * 64));
    be.attention(view(out, {n, 64}), view(part, {n, g.qkv_width()}), g, db, cache, 0.25f);
    return out;
  };
  auto whole = run(0, total);
  auto first = run(0, 9);
  auto rest = run(9, total);
  first.insert(first.end(), rest.begin(), rest.end());
  REQUIRE(first.size() == whole.size());
  for (std::size_t i = 0; i < whole.size(); ++i) REQUIRE(first[i] == Approx(whole[i]).margin(1e-6));
}

TEST_CASE("cpu backend threads poll long while a forward runs and briefly after the sample", "[cpu]") {
  // XSERV_CPU_*SPIN_US unset: 200 us from upload_batch on (decode and prefill batches alike),
  // 20 us from the end of sample() (and before the first forward); loops still run to
  // completion either way.
  const test::ScopedEnv spin("XSERV_CPU_SPIN_US", nullptr), prefill("XSERV_CPU_PREFILL_SPIN_US", nullptr),
      idle("XSERV_CPU_IDLE_SPIN_US", nullptr);
  CpuBackend be(BackendOptions{3, 0});
  auto batch = [](std::int32_t tokens) {
    ForwardBatch b;
    for (std::int32_t t = 0; t < tokens; ++t) {
      b.token_ids.push_back(0);
      b.positions.push_back(t);
      b.slot_mapping.push_back(t);
    }
    b.query_start = {0, tokens};
    b.context_lens = {tokens};
    b.block_tables = {0};
    b.max_blocks_per_seq = 1;
    return b;
  };
  REQUIRE(be.spin_us() == 20);
  be.upload_batch(batch(cpu::gemv_max_rows + 1));
  REQUIRE(be.spin_us() == 200);
  std::vector<float> x(4096, -1.0f);
  be.gelu(view(x, {4096}));
  REQUIRE(std::abs(x[4095] - (-0.158808f)) < 1e-5f);
  be.upload_batch(batch(cpu::gemv_max_rows));
  REQUIRE(be.spin_us() == 200);
  std::vector<float> logits = {0.5f, 2.0f, -1.0f};
  SamplingBatch params;
  params.rows.resize(1);
  params.rows[0].temperature = 0.0f;  // greedy
  std::int32_t id = -1;
  be.sample(view(logits, {1, 3}), params, &id);
  REQUIRE(id == 1);
  REQUIRE(be.spin_us() == 20);
}

TEST_CASE("cpu backend poll lengths follow XSERV_CPU_SPIN_US and XSERV_CPU_IDLE_SPIN_US", "[cpu]") {
  // XSERV_CPU_SPIN_US=20 is the rule before the idle poll existed: 20 us in decode throughout,
  // prefill at the larger of 200 and it.
  const test::ScopedEnv spin("XSERV_CPU_SPIN_US", "20"), prefill("XSERV_CPU_PREFILL_SPIN_US", nullptr),
      idle("XSERV_CPU_IDLE_SPIN_US", "5");
  CpuBackend be(BackendOptions{2, 0});
  REQUIRE(be.spin_us() == 5);
  ForwardBatch b;
  b.token_ids = {0};
  b.positions = {0};
  b.slot_mapping = {0};
  b.query_start = {0, 1};
  b.context_lens = {1};
  b.block_tables = {0};
  b.max_blocks_per_seq = 1;
  be.upload_batch(b);
  REQUIRE(be.spin_us() == 20);
}

TEST_CASE("cpu upload_batch copies the batch and ForwardBatch::validate checks it", "[cpu]") {
  CpuBackend be(BackendOptions{1, 0});
  DeviceBatch db;
  {
    ForwardBatch b;
    b.token_ids = {5, 6, 7};
    b.positions = {0, 1, 4};
    b.slot_mapping = {8, 9, 20};
    b.query_start = {0, 2, 3};
    b.context_lens = {2, 5};
    b.block_tables = {2, 0, 3, 5};
    b.logit_rows = {1, 2};
    b.max_blocks_per_seq = 2;
    REQUIRE_NOTHROW(b.validate(4));
    db = be.upload_batch(b);
    REQUIRE(db.num_tokens == 3);
    REQUIRE(db.num_seqs == 2);
    REQUIRE(db.num_logit_rows == 2);
    REQUIRE(db.max_query_len == 2);
    REQUIRE(db.max_context_len == 5);

    auto bad = b;
    bad.positions.pop_back();
    REQUIRE_THROWS_AS(bad.validate(4), Error);
    bad = b;
    bad.context_lens[1] = 9;  // needs 3 blocks of 4
    REQUIRE_THROWS_AS(bad.validate(4), Error);
    bad = b;
    bad.query_start = {0, 3, 2};
    REQUIRE_THROWS_AS(bad.validate(4), Error);
    bad = b;
    bad.logit_rows = {2, 1};
    REQUIRE_THROWS_AS(bad.validate(4), Error);
    bad = b;
    bad.slot_mapping[0] = -1;
    REQUIRE_THROWS_AS(bad.validate(4), Error);
  }
  // The source is gone; the views still read the copies.
  REQUIRE(db.token_ids.as<std::int32_t>()[2] == 7);
  REQUIRE(db.positions.as<std::int32_t>()[2] == 4);
  REQUIRE(db.slot_mapping.as<std::int32_t>()[1] == 9);
  REQUIRE(db.query_start.as<std::int32_t>()[1] == 2);
  REQUIRE(db.context_lens.as<std::int32_t>()[1] == 5);
  REQUIRE(db.block_tables.as<std::int32_t>()[3] == 5);
  REQUIRE(db.logit_rows.as<std::int32_t>()[0] == 1);
  REQUIRE(db.block_tables.shape == Shape{4});
}

TEST_CASE("make_backend gives the CPU backend, and CUDA is reported honestly", "[cpu]") {
  auto be = make_backend(DeviceKind::cpu, BackendOptions{2, 0});
  REQUIRE(be->device().kind == DeviceKind::cpu);
  REQUIRE(be->activation_dtype(DType::bf16) == DType::f32);
  if (!cuda_available()) {
    REQUIRE_THROWS_AS(make_backend(DeviceKind::cuda), Error);
  }
  std::vector<float> w(4, 1.0f);
  Tensor host(w.data(), DType::f32, Shape{4});
  REQUIRE(be->import_weight(host).data == w.data());
}

// The AMX prefill GEMM (cpu_amx.hpp): its loops with the tiles emulated on every CPU (packing
// into pair tiles, K and row padding, the 32-column groups, the epilogue and GELU), the tile
// instructions themselves where this CPU and kernel allow them, and the backend's path with
// XSERV_CPU_AMX=1 there. The reference rounds A to bf16 as the kernel does.
TEST_CASE(
    "cpu AMX bf16 prefill GEMM on emulated tiles everywhere and on the tiles where the CPU has "
    "them",
    "[cpu]") {
  std::mt19937 rng(11);
  struct Case {
    std::int64_t m, k, n, n0, n1;
    bool gelu, bias;
    float beta;
  };
  // Without bias or GELU and with beta 0 or 1, whole 32 x 32 blocks go between out and the
  // tiles directly (the last two cases); the others through the scalar epilogue.
  const Case cases[] = {
      {9, 70, 40, 0, 40, false, true, 1.0f},      {33, 64, 64, 0, 64, true, true, 0.0f},
      {40, 300, 70, 16, 70, false, true, 1.0f},   {64, 1024, 96, 32, 96, true, true, 0.0f},
      {17, 0, 20, 0, 20, false, true, 1.0f},      {1, 31, 5, 0, 5, false, true, 1.0f},
      {70, 200, 100, 0, 100, false, false, 1.0f}, {64, 96, 64, 0, 64, false, false, 0.0f}};
  const bool hw = cpu::amx_bf16_usable();
  {
    ScopedEnv off("XSERV_CPU_AMX", "0");
    REQUIRE(CpuBackend(BackendOptions{1, 0}).name().find("AMX") == std::string::npos);
  }
  for (const auto& c : cases) {
    INFO("m=" << c.m << " k=" << c.k << " n=" << c.n << " cols " << c.n0 << ".." << c.n1
              << " gelu=" << c.gelu << " bias=" << c.bias << " beta=" << c.beta);
    auto a = random_floats(rng, static_cast<std::size_t>(c.m * c.k));
    auto w = make_weight(rng, static_cast<std::size_t>(c.k * c.n), DType::bf16);
    auto bias = random_floats(rng, static_cast<std::size_t>(c.n));
    if (!c.bias) std::fill(bias.begin(), bias.end(), 0.0f);
    const auto out0 = random_floats(rng, static_cast<std::size_t>(c.m * c.n));
    const float beta = c.beta;
    const std::int64_t lda = cpu::amx_lda(c.k, c.m % 2 == 0);  // (odd m: no skew)
    const std::int64_t rows = cpu::amx_padded(c.m, cpu::amx_rows);
    std::vector<std::uint16_t> abf(static_cast<std::size_t>(rows * lda), 0xffff);
    cpu::amx_round_rows(a.data(), c.m, c.k, abf.data(), lda, 0, rows);
    std::vector<float> a_rounded(a.size());
    for (std::int64_t i = 0; i < c.m; ++i) {
      convert_to_f32(abf.data() + i * lda, DType::bf16, a_rounded.data() + i * c.k,
                     static_cast<std::size_t>(c.k));
      for (std::int64_t kk = c.k; kk < lda; ++kk)
        REQUIRE(abf[static_cast<std::size_t>(i * lda + kk)] == 0);
    }
    for (std::int64_t i = c.m; i < rows; ++i)
      for (std::int64_t kk = 0; kk < lda; ++kk)
        REQUIRE(abf[static_cast<std::size_t>(i * lda + kk)] == 0);
    std::vector<double> want(static_cast<std::size_t>(c.m * c.n)), mag(want.size());
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = c.n0; j < c.n1; ++j) {
        const auto o = static_cast<std::size_t>(i * c.n + j);
        double s = bias[static_cast<std::size_t>(j)] + beta * out0[o], s_abs = 0.0;
        for (std::int64_t kk = 0; kk < c.k; ++kk) {
          const double v = static_cast<double>(a_rounded[static_cast<std::size_t>(i * c.k + kk)]) *
                           w.values[static_cast<std::size_t>(j * c.k + kk)];
          s += v;
          s_abs += std::abs(v);
        }
        want[o] = c.gelu ? gelu_tanh(s) : s;
        mag[o] = s_abs + 1.0;
      }
    std::vector<float> scratch_store(
        static_cast<std::size_t>(cpu::amx_scratch_bytes(c.k) / 4 + 16));
    void* scratch = reinterpret_cast<void*>(
        (reinterpret_cast<std::uintptr_t>(scratch_store.data()) + 63) & ~std::uintptr_t{63});
    for (int run = 0; run < (hw ? 2 : 1); ++run) {
      INFO((run ? "AMX tiles" : "emulated tiles"));
      std::vector<float> out = column_block_out(out0, c.m, c.n, c.n0, c.n1, beta);
      cpu::GemmProblem p;
      p.a = a.data();
      p.m = c.m;
      p.k = c.k;
      p.n = c.n;
      p.w = w.tensor({c.n, c.k}).data;
      p.w_dtype = DType::bf16;
      p.layout = WeightLayout::out_in;
      p.bias = c.bias ? bias.data() : nullptr;
      p.beta = beta;
      p.out = out.data();
      p.ldo = c.n;
      p.gelu = c.gelu;
      p.a_bf16 = abf.data();
      p.lda_bf16 = lda;
      if (run == 0)
        cpu::amx_gemm_columns_emulated(p, c.n0, c.n1, scratch);
      else
        cpu::amx_gemm_columns(p, c.n0, c.n1, scratch);
      for (std::int64_t i = 0; i < c.m; ++i)
        for (std::int64_t j = 0; j < c.n; ++j) {
          const auto o = static_cast<std::size_t>(i * c.n + j);
          if (j < c.n0 || j >= c.n1) {
            REQUIRE(std::isnan(out[o]));
            continue;
          }
          INFO("row " << i << " col " << j << " got " << out[o] << " want " << want[o]);
          REQUIRE(std::abs(out[o] - want[o]) <= 1e-5 * mag[o]);
        }
    }
    if (c.m <= cpu::gemv_max_rows) continue;  // (GEMV rows keep f32 activations)
    // The backend's path (A rounded by the pool, tasks of 32-column groups): emulated on every
    // CPU, and on the tiles where the CPU has them.
    for (const char* mode : {"emulate", "1"}) {
      if (mode[0] == '1' && !hw) continue;
      INFO("backend with XSERV_CPU_AMX=" << mode);
      ScopedEnv amx("XSERV_CPU_AMX", mode);
      CpuBackend be(BackendOptions{3, 0});
      REQUIRE(be.name().find("AMX") != std::string::npos);
      std::vector<float> got(want.size());
      for (std::size_t i = 0; i < got.size(); ++i) got[i] = out0[i];
      be.gemm(Tensor(got.data(), DType::f32, Shape{c.m, c.n}), view(a, {c.m, c.k}),
              w.tensor({c.n, c.k}), WeightLayout::out_in, c.bias ? view(bias, {c.n}) : Tensor{},
              1.0f);
      // result = A_rounded . W^T (+ bias + the previous out), in double, within 1e-5 of the terms.
      auto check = [&](const std::vector<float>& result, bool accumulated, const char* what) {
        for (std::int64_t i = 0; i < c.m; ++i)
          for (std::int64_t j = 0; j < c.n; ++j) {
            const auto o = static_cast<std::size_t>(i * c.n + j);
            double s = accumulated ? bias[static_cast<std::size_t>(j)] + out0[o] : 0.0, s_abs = 0.0;
            for (std::int64_t kk = 0; kk < c.k; ++kk) {
              const double v =
                  static_cast<double>(a_rounded[static_cast<std::size_t>(i * c.k + kk)]) *
                  w.values[static_cast<std::size_t>(j * c.k + kk)];
              s += v;
              s_abs += std::abs(v);
            }
            INFO(what << " row " << i << " col " << j << " got " << result[o] << " want " << s);
            REQUIRE(std::abs(result[o] - s) <= 1e-5 * (s_abs + 1.0));
          }
      };
      check(got, true, "backend");
      // gemm_parts: W's first 32 rows and the rest as two parts, one A rounding, one loop.
      if (c.n <= 32) continue;
      const auto* wd = static_cast<const std::uint16_t*>(w.tensor({c.n, c.k}).data);
      const Tensor parts[] = {
          Tensor(const_cast<std::uint16_t*>(wd), DType::bf16, Shape{32, c.k}),
          Tensor(const_cast<std::uint16_t*>(wd + 32 * c.k), DType::bf16, Shape{c.n - 32, c.k})};
      std::vector<float> got_parts(want.size(), NAN);
      be.gemm_parts(Tensor(got_parts.data(), DType::f32, Shape{c.m, c.n}), view(a, {c.m, c.k}),
                    parts, {});
      check(got_parts, false, "gemm_parts");
    }
  }
}
