// GPU sampling against the CPU backend's: the same ids for greedy, temperature, top-k, top-p,
// min-p and penalties, since both draw u = sampling_uniform(seed, step) and walk the tokens in
// (probability desc, id asc) order. Logits are random normals (no exact ties among the kept
// tokens), so any difference is a bug, not rounding.
#include <algorithm>
#include <numeric>

#include "cuda_test_util.hpp"
#include "support/scoped_env.hpp"

using namespace xserv;
using namespace xserv::test;

namespace {

SamplingRow row_of(float t, std::int32_t k, float p, float mp, std::uint64_t seed) {
  SamplingRow r;
  r.temperature = t;
  r.top_k = k;
  r.top_p = p;
  r.min_p = mp;
  r.seed = seed;
  r.step = seed * 7 + 3;
  return r;
}

// A short prompt and output history for every row (what the penalties read), ids spread over
// the vocabulary.
void add_histories(SamplingBatch& sb, std::int64_t vocab) {
  sb.prompt_start.assign(1, 0);
  sb.output_start.assign(1, 0);
  for (std::size_t r = 0; r < sb.rows.size(); ++r) {
    for (std::size_t i = 0; i < 5; ++i) sb.prompt_tokens.push_back(static_cast<std::int32_t>((r * 13 + i * 7) % vocab));
    for (std::size_t i = 0; i < 3; ++i) sb.output_tokens.push_back(static_cast<std::int32_t>((r * 5 + i) % vocab));
    sb.prompt_start.push_back(static_cast<std::int32_t>(sb.prompt_tokens.size()));
    sb.output_start.push_back(static_cast<std::int32_t>(sb.output_tokens.size()));
  }
}

}  // namespace

TEST_CASE("cuda sample matches the CPU backend", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(11);
  for (std::int64_t vocab : {1000, 151936}) {
    SamplingBatch sb;
    for (std::uint64_t s = 0; s < 6; ++s) {
      sb.rows.push_back(row_of(0.0f, 0, 1.0f, 0.0f, s));      // greedy
      sb.rows.push_back(row_of(0.7f, 0, 1.0f, 0.0f, s));      // temperature only
      sb.rows.push_back(row_of(1.0f, 50, 1.0f, 0.0f, s));     // top-k
      sb.rows.push_back(row_of(1.0f, 0, 0.9f, 0.0f, s));      // top-p
      sb.rows.push_back(row_of(1.3f, 0, 1.0f, 0.05f, s));     // min-p
      sb.rows.push_back(row_of(0.8f, 40, 0.8f, 0.02f, s));    // all filters
      sb.rows.push_back(row_of(1.0f, 1, 1.0f, 0.0f, s));      // top-k 1 = greedy
    }
    const auto rows = static_cast<std::int64_t>(sb.rows.size());
    INFO("vocab " << vocab << " rows " << rows);
    auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
    auto cl = logits;
    std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(want.size(), -1);
    be.cpu.sample(host_view(cl, {rows, vocab}), sb, want.data());
    be.gpu->sample(be.gpu_tensor(logits, DType::f32, {rows, vocab}), sb, got.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      INFO("row " << r << " temperature " << sb.rows[static_cast<std::size_t>(r)].temperature
                  << " top_k " << sb.rows[static_cast<std::size_t>(r)].top_k << " top_p "
                  << sb.rows[static_cast<std::size_t>(r)].top_p << " min_p "
                  << sb.rows[static_cast<std::size_t>(r)].min_p);
      REQUIRE(got[static_cast<std::size_t>(r)] == want[static_cast<std::size_t>(r)]);
    }
  }
}

// Batches whose rows are all greedy or top-k <= 1024 take the split-row path (sampling_topk.cu):
// the same ids as the CPU, and the in-place penalised/tempered logits too.
TEST_CASE("cuda sample, split-row top-k path, matches the CPU backend", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(12);
  for (std::int64_t vocab : {37, 1000, 151936}) {
    for (std::int32_t k_big : {20, 1024}) {
      SamplingBatch sb;
      for (std::uint64_t s = 0; s < 5; ++s) {
        sb.rows.push_back(row_of(0.0f, 0, 1.0f, 0.0f, s));       // greedy
        sb.rows.push_back(row_of(0.6f, 20, 0.95f, 0.0f, s));     // Qwen3's defaults
        sb.rows.push_back(row_of(1.0f, k_big, 1.0f, 0.0f, s));   // top-k alone
        sb.rows.push_back(row_of(0.8f, 7, 0.8f, 0.02f, s));      // all filters
        sb.rows.push_back(row_of(1.3f, 1, 1.0f, 0.0f, s));       // top-k 1 = greedy
        sb.rows.push_back(row_of(2.0f, k_big, 0.5f, 0.3f, s));   // min-p cuts inside top-p
      }
      for (std::size_t r = 0; r < sb.rows.size(); r += 3) sb.rows[r].repetition_penalty = 1.3f;
      add_histories(sb, vocab);
      const auto rows = static_cast<std::int64_t>(sb.rows.size());
      INFO("vocab " << vocab << " k " << k_big);
      auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
      auto cl = logits;
      std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(want.size(), -1);
      be.cpu.sample(host_view(cl, {rows, vocab}), sb, want.data());
      Tensor gl = be.gpu_tensor(logits, DType::f32, {rows, vocab});
      be.gpu->sample(gl, sb, got.data());
      for (std::int64_t r = 0; r < rows; ++r) {
        INFO("row " << r << " temperature " << sb.rows[static_cast<std::size_t>(r)].temperature
                    << " top_k " << sb.rows[static_cast<std::size_t>(r)].top_k);
        REQUIRE(got[static_cast<std::size_t>(r)] == want[static_cast<std::size_t>(r)]);
      }
    }
  }
}

// A batched decode step's sampling: many rows, mostly greedy (the one-pass block max of the
// split path) beside Qwen3's top-k 20 rows (the radix select), with penalties on some, the row's
// best logit tied at two ids (the lower id wins, as on the CPU) and placed in different blocks'
// chunks. Greedy rows without penalties must leave their logits untouched; rows with a
// temperature hold logit / temperature afterwards (the documented in-place change).
TEST_CASE("cuda sample of many greedy and top-k rows matches the CPU backend", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(15);
  for (std::int64_t vocab : {37, 1000, 151936}) {
    for (std::int64_t rows : {1, 13, 130}) {
      SamplingBatch sb;
      for (std::int64_t r = 0; r < rows; ++r) {
        const auto s = static_cast<std::uint64_t>(r);
        if (r % 5 == 3) sb.rows.push_back(row_of(0.6f, 20, 0.95f, 0.0f, s));  // Qwen3's defaults
        else if (r % 7 == 5) sb.rows.push_back(row_of(1.3f, 1, 1.0f, 0.0f, s));  // top-k 1
        else sb.rows.push_back(row_of(0.0f, 0, 1.0f, 0.0f, s));  // greedy
      }
      for (std::size_t r = 0; r < sb.rows.size(); r += 4) sb.rows[r].repetition_penalty = 1.3f;
      add_histories(sb, vocab);
      INFO("vocab " << vocab << " rows " << rows);
      auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
      for (std::int64_t r = 0; r < rows; ++r) {
        float* x = logits.data() + r * vocab;
        const std::int64_t at = (r * 7919) % vocab, twin = (at + vocab / 2 + 1) % vocab;
        x[at] = 20.0f;
        if (r % 2 == 0) x[twin] = 20.0f;  // a tie: the lower of the two ids is the greedy pick
      }
      auto cl = logits;
      std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(want.size(), -1);
      be.cpu.sample(host_view(cl, {rows, vocab}), sb, want.data());
      Tensor gl = be.gpu_tensor(logits, DType::f32, {rows, vocab});
      be.gpu->sample(gl, sb, got.data());
      for (std::int64_t r = 0; r < rows; ++r) {
        INFO("row " << r << " temperature " << sb.rows[static_cast<std::size_t>(r)].temperature
                    << " top_k " << sb.rows[static_cast<std::size_t>(r)].top_k);
        REQUIRE(got[static_cast<std::size_t>(r)] == want[static_cast<std::size_t>(r)]);
      }
      const std::vector<float> after = be.read(gl);
      for (std::int64_t r = 0; r < rows; ++r) {
        const SamplingRow& sr = sb.rows[static_cast<std::size_t>(r)];
        if (sr.repetition_penalty != 1.0f) continue;  // penalised rows: covered by the ids
        const bool greedy = sr.temperature <= 0.0f;
        for (std::int64_t i = 0; i < vocab; ++i) {
          const float x = logits[static_cast<std::size_t>(r * vocab + i)];
          const float expect = greedy ? x : x / sr.temperature;
          if (after[static_cast<std::size_t>(r * vocab + i)] != expect) {
            INFO("row " << r << " id " << i << " temperature " << sr.temperature);
            REQUIRE(after[static_cast<std::size_t>(r * vocab + i)] == expect);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda sample: greedy batches in one kernel (XSERV_CUDA_SAMPLE_ONE_PASS) match the CPU backend", "[cuda]") {
  // The last block of a row picks the id from the blocks' best keys and resets its ticket, so a
  // second launch on the same backend must be right too. Vocab 100: 64 blocks of 2 logits, so
  // the last 14 blocks of a row have empty chunks and still take their tickets. Ties: the lower
  // id wins; penalised rows: the adjusted logits.
  XSERV_REQUIRE_CUDA_DEVICE();
  const ScopedEnv one("XSERV_CUDA_SAMPLE_ONE_PASS", "1");
  GpuCpu be;
  std::mt19937 rng(16);
  for (std::int64_t vocab : {37, 100, 151936}) {
    for (std::int64_t rows : {1, 13, 130}) {
      for (int round = 0; round < 2; ++round) {
        SamplingBatch sb;
        for (std::int64_t r = 0; r < rows; ++r) sb.rows.push_back(row_of(0.0f, 0, 1.0f, 0.0f, static_cast<std::uint64_t>(r)));
        for (auto r = static_cast<std::size_t>(round); r < sb.rows.size(); r += 3) sb.rows[r].repetition_penalty = 1.3f;
        add_histories(sb, vocab);
        INFO("vocab " << vocab << " rows " << rows << " round " << round);
        auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
        for (std::int64_t r = 0; r < rows; ++r) {
          float* x = logits.data() + r * vocab;
          const std::int64_t at = (r * 7919 + round) % vocab, twin = (at + vocab / 2 + 1) % vocab;
          x[at] = 20.0f;
          if (r % 2 == 0) x[twin] = 20.0f;
        }
        auto cl = logits;
        std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(want.size(), -1);
        be.cpu.sample(host_view(cl, {rows, vocab}), sb, want.data());
        Tensor gl = be.gpu_tensor(logits, DType::f32, {rows, vocab});
        be.gpu->sample(gl, sb, got.data());
        REQUIRE(got == want);
      }
    }
  }
}

// Batches with a row past the split path (no top-k, or top-k > 1024) take the many-blocks-per-row
// radix select (sampling.cu): every filter combination, flat rows where top-p keeps most of the
// vocabulary (the select then narrows over many passes), ties, penalties and one-block vocabs.
TEST_CASE("cuda sample, many blocks per row, matches the CPU backend", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(14);
  for (std::int64_t vocab : {37, 4096, 5000, 151936}) {
    SamplingBatch sb;
    for (std::uint64_t s = 0; s < 4; ++s) {
      sb.rows.push_back(row_of(1.0f, 0, 1.0f, 0.0f, s));       // plain draw (OpenAI's defaults)
      sb.rows.push_back(row_of(0.6f, 0, 0.95f, 0.0f, s));      // top-p alone
      sb.rows.push_back(row_of(1.0f, 3000, 1.0f, 0.0f, s));    // large top-k
      sb.rows.push_back(row_of(0.9f, 2000, 0.7f, 0.01f, s));   // every filter
      sb.rows.push_back(row_of(0.0f, 0, 1.0f, 0.0f, s));       // greedy beside them
      sb.rows.push_back(row_of(1.2f, 0, 0.5f, 0.2f, s));       // min-p inside top-p
      sb.rows.push_back(row_of(1.0f, 0, 1.0f, 1.0f, s));       // min-p 1: the best token
    }
    for (std::size_t r = 0; r < sb.rows.size(); r += 4) sb.rows[r].repetition_penalty = 1.3f;
    for (std::size_t r = 1; r < sb.rows.size(); r += 5) sb.rows[r].frequency_penalty = 0.4f;
    add_histories(sb, vocab);
    const auto rows = static_cast<std::int64_t>(sb.rows.size());
    // Half the rows peaked (normals, std 3), half nearly flat: a shuffled ramp over [0, 0.5), so
    // top-p keeps most of the vocabulary and the probabilities stay distinct in float (random
    // flat rows would tie in p where the logits differ; the CPU orders such ties by id, the GPU
    // by logit). A tied pair of logits in every row.
    auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
    std::vector<std::int64_t> perm(static_cast<std::size_t>(vocab));
    for (std::int64_t r = 1; r < rows; r += 2) {
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (std::int64_t i = 0; i < vocab; ++i)
        logits[static_cast<std::size_t>(r * vocab + i)] = 0.5f * static_cast<float>(perm[static_cast<std::size_t>(i)]) / static_cast<float>(vocab);
    }
    for (std::int64_t r = 0; r < rows; ++r)
      logits[static_cast<std::size_t>(r * vocab + vocab / 2)] = logits[static_cast<std::size_t>(r * vocab + 1)];
    auto cl = logits;
    std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(want.size(), -1);
    be.cpu.sample(host_view(cl, {rows, vocab}), sb, want.data());
    be.gpu->sample(be.gpu_tensor(logits, DType::f32, {rows, vocab}), sb, got.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      const SamplingRow& sr = sb.rows[static_cast<std::size_t>(r)];
      INFO("vocab " << vocab << " row " << r << " temperature " << sr.temperature << " top_k "
                    << sr.top_k << " top_p " << sr.top_p << " min_p " << sr.min_p);
      REQUIRE(got[static_cast<std::size_t>(r)] == want[static_cast<std::size_t>(r)]);
    }
  }
}

TEST_CASE("cuda sample applies repetition, presence and frequency penalties like the CPU", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(12);
  const std::int64_t vocab = 5000;
  SamplingBatch sb;
  sb.prompt_start.push_back(0);
  sb.output_start.push_back(0);
  for (int r = 0; r < 12; ++r) {
    SamplingRow row = row_of(r % 3 == 0 ? 0.0f : 0.9f, r % 2 ? 20 : 0, 0.95f, 0.0f, static_cast<std::uint64_t>(r));
    row.repetition_penalty = r % 4 == 1 ? 1.0f : 1.3f;
    row.presence_penalty = r % 4 == 2 ? 0.0f : 0.8f;
    row.frequency_penalty = r % 4 == 3 ? 0.0f : 0.5f;
    sb.rows.push_back(row);
    // Histories pick among the likeliest tokens so the penalties change the outcome.
    for (int i = 0; i < 30; ++i) sb.prompt_tokens.push_back(static_cast<std::int32_t>(rng() % 40));
    for (int i = 0; i < 25; ++i) sb.output_tokens.push_back(static_cast<std::int32_t>(rng() % 40));
    sb.prompt_start.push_back(static_cast<std::int32_t>(sb.prompt_tokens.size()));
    sb.output_start.push_back(static_cast<std::int32_t>(sb.output_tokens.size()));
  }
  const auto rows = static_cast<std::int64_t>(sb.rows.size());
  auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 1.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < 40; ++i) logits[static_cast<std::size_t>(r * vocab + i)] += 4.0f;
  auto cl = logits;
  std::vector<std::int32_t> want(static_cast<std::size_t>(rows)), got(want.size(), -1);
  be.cpu.sample(host_view(cl, {rows, vocab}), sb, want.data());
  be.gpu->sample(be.gpu_tensor(logits, DType::f32, {rows, vocab}), sb, got.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    REQUIRE(got[static_cast<std::size_t>(r)] == want[static_cast<std::size_t>(r)]);
  }
  // A history token outside the vocabulary is an error, not a wild write.
  sb.output_tokens[0] = static_cast<std::int32_t>(vocab);
  REQUIRE_THROWS_AS(be.gpu->sample(be.gpu_tensor(logits, DType::f32, {rows, vocab}), sb, got.data()), Error);
}

TEST_CASE("cuda sample: a seed gives the same stream, and draws follow the distribution", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  // Four tokens with probabilities 0.1, 0.2, 0.3, 0.4: 4000 draws land within 3% of them.
  const std::vector<float> probs = {0.1f, 0.2f, 0.3f, 0.4f};
  const std::int64_t n = 4000;
  std::vector<float> logits;
  SamplingBatch sb;
  for (std::int64_t i = 0; i < n; ++i) {
    for (float p : probs) logits.push_back(std::log(p));
    SamplingRow r;
    r.seed = 99;
    r.step = static_cast<std::uint64_t>(i);
    sb.rows.push_back(r);
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n)), again(ids.size());
  be.gpu->sample(be.gpu_tensor(logits, DType::f32, {n, 4}), sb, ids.data());
  be.gpu->sample(be.gpu_tensor(logits, DType::f32, {n, 4}), sb, again.data());
  REQUIRE(ids == again);
  std::vector<int> hist(4, 0);
  for (auto id : ids) {
    REQUIRE(id >= 0);
    REQUIRE(id < 4);
    ++hist[static_cast<std::size_t>(id)];
  }
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(std::abs(hist[i] / static_cast<double>(n) - probs[i]) < 0.03);
}

TEST_CASE("cuda logprobs match the CPU backend: chosen token and the top 20", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(13);
  for (std::int64_t vocab : {7, 1000, 151936}) {
    const std::int64_t rows = 5;
    auto logits = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
    // A tie at the top of row 1: the lower id comes first on both backends.
    logits[static_cast<std::size_t>(vocab) + 2] = 50.0f;
    logits[static_cast<std::size_t>(vocab) + 4] = 50.0f;
    std::vector<std::int32_t> ids;
    for (std::int64_t r = 0; r < rows; ++r) ids.push_back(static_cast<std::int32_t>((r * 37) % vocab));
    const std::int32_t top_n = 20;
    const auto top = static_cast<std::size_t>(rows * top_n);
    std::vector<float> want_lp(static_cast<std::size_t>(rows)), got_lp(want_lp.size(), 1.0f);
    std::vector<std::int32_t> want_ids(top), got_ids(top, -7);
    std::vector<float> want_top(top), got_top(top, 1.0f);
    be.cpu.logprobs(host_view(logits, {rows, vocab}), ids.data(), top_n, want_lp.data(),
                    want_ids.data(), want_top.data());
    be.gpu->logprobs(be.gpu_tensor(logits, DType::f32, {rows, vocab}), ids.data(), top_n,
                     got_lp.data(), got_ids.data(), got_top.data());
    INFO("vocab " << vocab);
    // Tolerance: lse in float vs double partial sums over up to 152k terms.
    for (std::size_t r = 0; r < want_lp.size(); ++r) CHECK(got_lp[r] == Approx(want_lp[r]).margin(1e-4));
    for (std::size_t i = 0; i < top; ++i) {
      INFO("entry " << i);
      CHECK(got_ids[i] == want_ids[i]);
      if (want_ids[i] >= 0) CHECK(got_top[i] == Approx(want_top[i]).margin(1e-4));
    }
    CHECK(want_ids[static_cast<std::size_t>(top_n)] == 2);
    CHECK(want_ids[static_cast<std::size_t>(top_n) + 1] == 4);
  }
}

// The overlapped engine steps' ops: sample_async gives sample()'s ids (two tickets open at once,
// read in either order), leaves them on the device, and resolve_tokens puts them in place of the
// negative placeholders of a token list.
TEST_CASE("cuda sample_async gives the CPU ids and resolve_tokens reads them on the device", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  GpuCpu be;
  std::mt19937 rng(5);
  for (std::int64_t vocab : {1000, 151936}) {
    INFO("vocab " << vocab);
    SamplingBatch sb;
    for (std::uint64_t s = 0; s < 5; ++s) {
      sb.rows.push_back(row_of(0.0f, 0, 1.0f, 0.0f, s));
      sb.rows.push_back(row_of(0.9f, 20, 0.95f, 0.0f, s));
      sb.rows.push_back(row_of(1.0f, 0, 0.9f, 0.0f, s));
    }
    const auto rows = static_cast<std::int64_t>(sb.rows.size());
    auto logits_a = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
    auto logits_b = randn(rng, static_cast<std::size_t>(rows * vocab), 3.0f);
    std::vector<std::int32_t> want_a(static_cast<std::size_t>(rows)), want_b(want_a.size());
    auto ca = logits_a, cb = logits_b;
    be.cpu.sample(host_view(ca, {rows, vocab}), sb, want_a.data());
    be.cpu.sample(host_view(cb, {rows, vocab}), sb, want_b.data());

    const Tensor ids_a = be.gpu_ints(std::vector<std::int32_t>(want_a.size(), -7), {rows});
    const Tensor ids_b = be.gpu_ints(std::vector<std::int32_t>(want_a.size(), -7), {rows});
    const std::uint64_t ta = be.gpu->sample_async(be.gpu_tensor(logits_a, DType::f32, {rows, vocab}), sb, ids_a);
    const std::uint64_t tb = be.gpu->sample_async(be.gpu_tensor(logits_b, DType::f32, {rows, vocab}), sb, ids_b);
    CHECK(ta != tb);
    // Tokens: real ids stay, -(r + 1) becomes row r of the sampled ids (resolved behind b).
    std::vector<std::int32_t> tokens;
    std::vector<std::int32_t> want_tokens;
    for (std::int32_t i = 0; i < 300; ++i) {
      const std::int32_t r = (i * 7) % static_cast<std::int32_t>(rows);
      if (i % 3 == 0) {
        tokens.push_back(i);
        want_tokens.push_back(i);
      } else {
        tokens.push_back(-(r + 1));
        want_tokens.push_back(want_b[static_cast<std::size_t>(r)]);
      }
    }
    const Tensor dev_tokens = be.gpu_ints(tokens, {static_cast<std::int64_t>(tokens.size())});
    be.gpu->resolve_tokens(dev_tokens, ids_b);
    std::vector<std::int32_t> got_b(want_b.size(), -1), got_a(want_a.size(), -1);
    be.gpu->wait_sampled(tb, got_b.data());  // the later ticket first
    be.gpu->wait_sampled(ta, got_a.data());
    CHECK(got_a == want_a);
    CHECK(got_b == want_b);
    std::vector<std::int32_t> resolved(tokens.size(), -1);
    be.gpu->download(resolved.data(), dev_tokens);
    CHECK(resolved == want_tokens);
    std::vector<std::int32_t> on_device(want_a.size(), -1);
    be.gpu->download(on_device.data(), ids_a);
    CHECK(on_device == want_a);
  }
}
