// CPU sampling: greedy ties, penalties, seed determinism, top-k/top-p/min-p masks (tokens outside
// the mask are never drawn over many seeds), the draw against a naive full-sort reference, and
// sampling_uniform itself.
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "backend/cpu/cpu_backend.hpp"
#include "core/error.hpp"
#include "cpu_test_util.hpp"

using namespace xserv;
using xserv::cpu::sample_row;
using namespace xserv::test;

namespace {

std::int32_t draw(std::vector<float> logits, const SamplingRow& row) {
  return sample_row(logits, row, {}, {});
}

// The sampling spec, written plainly: full sort, every filter over the whole vocabulary.
std::int32_t naive_sample(std::vector<float> logits, const SamplingRow& row) {
  const std::size_t v = logits.size();
  float mx = -INFINITY;
  for (auto& l : logits) mx = std::max(mx, l /= row.temperature);
  std::vector<std::pair<float, std::int32_t>> c;
  for (std::size_t i = 0; i < v; ++i)
    c.push_back({std::exp(logits[i] - mx), static_cast<std::int32_t>(i)});
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::size_t n = v;
  if (row.top_k > 0) n = std::min<std::size_t>(n, static_cast<std::size_t>(row.top_k));
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) total += c[i].first;
  if (row.top_p < 1.0f) {
    double cum = 0.0;
    std::size_t keep = 0;
    while (keep < n) {
      cum += c[keep++].first;
      if (cum >= row.top_p * total) break;
    }
    n = keep;
  }
  if (row.min_p > 0.0f) {
    std::size_t keep = 1;
    while (keep < n && c[keep].first >= row.min_p * c[0].first) ++keep;
    n = keep;
  }
  double mass = 0.0;
  for (std::size_t i = 0; i < n; ++i) mass += c[i].first;
  const double target = sampling_uniform(row.seed, row.step) * mass;
  double cum = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    if ((cum += c[i].first) > target) return c[i].second;
  return c[n - 1].second;
}

}  // namespace

TEST_CASE("sampling_uniform is deterministic, within the unit interval and spread", "[cpu]") {
  REQUIRE(sampling_uniform(42, 7) == sampling_uniform(42, 7));
  REQUIRE(sampling_uniform(42, 7) != sampling_uniform(42, 8));
  REQUIRE(sampling_uniform(42, 7) != sampling_uniform(43, 7));
  double sum = 0.0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const float u = sampling_uniform(i % 17, i);
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
  }
  REQUIRE(sum / 10000 == Approx(0.5).margin(0.02));
}

TEST_CASE("cpu greedy sampling takes the first maximum", "[cpu]") {
  SamplingRow greedy;
  greedy.temperature = 0.0f;
  REQUIRE(draw({1.0f, 3.0f, -2.0f, 3.0f, 0.5f}, greedy) == 1);
  REQUIRE(draw({-5.0f, -4.0f, -4.0f}, greedy) == 1);
  greedy.temperature = -1.0f;
  REQUIRE(draw({0.0f, 0.0f, 0.0f}, greedy) == 0);
}

TEST_CASE("cpu argmax kernels give the first maximum on every instruction set", "[cpu]") {
  // Against a scalar scan, exact (an index): odd lengths around the vector widths, ties placed
  // in different lanes and in the tail, NaN that must never win.
  std::mt19937 rng(11);
  for (const auto* kt : cpu::supported_kernels()) {
    for (std::int64_t n : {1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 100, 1000, 50257}) {
      INFO(kt->isa << " n=" << n);
      std::uniform_int_distribution<int> level(-20, 20);  // few distinct values: many ties
      std::vector<float> x(static_cast<std::size_t>(n));
      for (auto& v : x) v = static_cast<float>(level(rng)) * 0.25f;
      auto first_max = [&] {
        std::size_t best = 0;
        for (std::size_t i = 1; i < x.size(); ++i)
          if (x[i] > x[best]) best = i;
        return static_cast<std::int64_t>(best);
      };
      REQUIRE(kt->argmax(x.data(), n) == first_max());
      x[static_cast<std::size_t>(n - 1)] = 100.0f;  // the maximum in the tail / last lane
      REQUIRE(kt->argmax(x.data(), n) == n - 1);
      x[static_cast<std::size_t>(n / 2)] = 100.0f;  // a tie earlier wins
      REQUIRE(kt->argmax(x.data(), n) == n / 2);
      if (n > 1) {
        x[0] = NAN;
        x[static_cast<std::size_t>(n - 1)] = NAN;
        REQUIRE(kt->argmax(x.data(), n) == n / 2);
      }
    }
    const std::vector<float> all_nan(9, NAN), all_neg_inf(9, -INFINITY);
    CHECK(kt->argmax(all_nan.data(), 9) == 0);
    CHECK(kt->argmax(all_neg_inf.data(), 9) == 0);
  }
}

TEST_CASE("cpu sampling penalties follow HF and OpenAI semantics", "[cpu]") {
  SamplingRow row;
  row.temperature = 0.0f;  // greedy returns right after the penalties: inspect the logits
  row.repetition_penalty = 2.0f;
  row.presence_penalty = 0.5f;
  row.frequency_penalty = 0.25f;
  std::vector<float> logits{1.0f, 4.0f, -1.0f, 3.0f, 2.0f, -3.0f};
  const std::vector<std::int32_t> prompt{1, 2, 1}, output{3, 5, 5, 3, 3};
  sample_row(logits, row, prompt, output);
  // Repetition once per distinct token of prompt + output; presence/frequency on output only.
  REQUIRE(logits[0] == 1.0f);
  REQUIRE(logits[1] == 2.0f);
  REQUIRE(logits[2] == -2.0f);
  REQUIRE(logits[3] == Approx(3.0f / 2.0f - 0.5f - 0.75f));
  REQUIRE(logits[4] == 2.0f);
  REQUIRE(logits[5] == Approx(-6.0f - 0.5f - 0.5f));
  std::vector<float> l2{0.0f, 1.0f};
  const std::vector<std::int32_t> bad{2};
  REQUIRE_THROWS_AS(sample_row(l2, row, bad, {}), Error);
}

TEST_CASE("cpu sampling is deterministic per (seed, step) and follows the distribution", "[cpu]") {
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  SamplingRow row;
  std::map<std::int32_t, int> hist;
  const int draws = 4000;
  for (int i = 0; i < draws; ++i) {
    row.seed = 1234;
    row.step = static_cast<std::uint64_t>(i);
    const auto a = draw(logits, row);
    REQUIRE(a == draw(logits, row));
    ++hist[a];
  }
  for (int t = 0; t < 4; ++t)
    REQUIRE(static_cast<double>(hist[t]) / draws == Approx((t + 1) / 10.0).margin(0.025));
  // temperature flattens: at T = 1000 the four are nearly uniform.
  row.temperature = 1000.0f;
  hist.clear();
  for (int i = 0; i < draws; ++i) {
    row.step = static_cast<std::uint64_t>(i);
    ++hist[draw(logits, row)];
  }
  for (int t = 0; t < 4; ++t) REQUIRE(static_cast<double>(hist[t]) / draws == Approx(0.25).margin(0.03));
}

TEST_CASE("cpu top-k, top-p and min-p never draw outside their masks", "[cpu]") {
  std::mt19937 rng(9);
  auto logits = random_floats(rng, 300, -3.0f, 3.0f);
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
  std::vector<double> p(logits.size());
  double z = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i]);
  for (auto& e : p) e /= z;

  auto check_mask = [&](const SamplingRow& base, const std::set<std::int32_t>& allowed) {
    std::set<std::int32_t> seen;
    SamplingRow row = base;
    for (std::uint64_t s = 0; s < 1500; ++s) {
      row.seed = s * 7919;
      row.step = s;
      const auto id = draw(logits, row);
      INFO("drew " << id);
      REQUIRE(allowed.count(id) == 1);
      seen.insert(id);
    }
    return seen.size();
  };
  SECTION("top-k") {
    SamplingRow row;
    row.top_k = 5;
    REQUIRE(check_mask(row, std::set<std::int32_t>(order.begin(), order.begin() + 5)) == 5);
  }
  SECTION("top-p keeps the smallest prefix reaching p") {
    SamplingRow row;
    row.top_p = 0.3f;
    std::set<std::int32_t> allowed;
    double cum = 0.0;
    for (auto id : order) {
      allowed.insert(id);
      if ((cum += p[static_cast<std::size_t>(id)]) >= 0.3) break;
    }
    REQUIRE(check_mask(row, allowed) == allowed.size());
    row.top_p = 1e-6f;  // always at least one token
    REQUIRE(check_mask(row, {order[0]}) == 1);
  }
  SECTION("min-p") {
    SamplingRow row;
    row.min_p = 0.5f;
    std::set<std::int32_t> allowed;
    for (auto id : order)
      if (p[static_cast<std::size_t>(id)] >= 0.5 * p[static_cast<std::size_t>(order[0])]) allowed.insert(id);
    REQUIRE(check_mask(row, allowed) == allowed.size());
  }
  SECTION("top-k then top-p over the renormalised top-k") {
    SamplingRow row;
    row.top_k = 10;
    row.top_p = 0.5f;
    double z10 = 0.0;
    for (int i = 0; i < 10; ++i) z10 += p[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
    std::set<std::int32_t> allowed;
    double cum = 0.0;
    for (int i = 0; i < 10; ++i) {
      allowed.insert(order[static_cast<std::size_t>(i)]);
      if ((cum += p[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] / z10) >= 0.5) break;
    }
    check_mask(row, allowed);
  }
}

TEST_CASE("cpu sampling over a large vocabulary equals the full-sort reference", "[cpu]") {
  // Exercises the sorted-head shortcut against the plain algorithm.
  std::mt19937 rng(10);
  auto logits = random_floats(rng, 50000, -8.0f, 8.0f);
  logits[123] = 14.0f;  // a peaked row too
  SamplingRow rows[6];
  rows[1].top_k = 40;
  rows[2].top_p = 0.9f;
  rows[3].min_p = 0.05f;
  rows[4].top_k = 100, rows[4].top_p = 0.8f, rows[4].temperature = 0.7f;
  rows[5].temperature = 3.0f, rows[5].min_p = 1e-9f;
  for (const auto& base : rows) {
    for (std::uint64_t s = 0; s < 30; ++s) {
      SamplingRow row = base;
      row.seed = 99;
      row.step = s;
      INFO("top_k " << row.top_k << " top_p " << row.top_p << " min_p " << row.min_p << " T "
                    << row.temperature << " step " << s);
      REQUIRE(draw(logits, row) == naive_sample(logits, row));
    }
  }
}

TEST_CASE("cpu backend sample validates and runs every row", "[cpu]") {
  cpu::CpuBackend be(BackendOptions{2, 0});
  std::vector<float> logits{0.0f, 5.0f, 1.0f, 9.0f, 2.0f, 3.0f};
  SamplingBatch sb;
  sb.rows.resize(2);
  sb.rows[0].temperature = 0.0f;
  sb.rows[1].temperature = 0.0f;
  sb.rows[1].repetition_penalty = 10.0f;
  sb.prompt_tokens = {0};
  sb.prompt_start = {0, 0, 1};
  sb.output_tokens = {};
  sb.output_start = {0, 0, 0};
  std::int32_t ids[2] = {-1, -1};
  // Row 1's penalised token 0 (logit 9 -> 0.9) loses to token 2 (3).
  be.sample(view(logits, {2, 3}), sb, ids);
  REQUIRE(ids[0] == 1);
  REQUIRE(ids[1] == 2);
  sb.prompt_start = {0, 1};
  REQUIRE_THROWS_AS(be.sample(view(logits, {2, 3}), sb, ids), Error);
}
