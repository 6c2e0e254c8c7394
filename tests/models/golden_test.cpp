// Parity with Hugging Face transformers on the committed fixtures (made by
// tests/reference/make_model_fixtures.py, see each golden.json's "meta"): logits of one forward
// over each prompt, and 32-token greedy continuations through the Engine.
#include "support/golden.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_amx.hpp"
#include "core/mapped_file.hpp"
#include "engine/generate.hpp"
#include "io/safetensors.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "support/scoped_env.hpp"

using namespace xserv;

namespace {

using test::GoldenCase;

// tol: the metric's bound (relative to each row's largest HF logit); greedy: also compare the
// 32-token continuations (not where rounding can flip a near tie).
void check_golden(const std::string& model_dir, const std::string& golden_dir, float tol = 1e-4f,
                  bool greedy = true) {
  INFO("model " << model_dir);
  auto backend = make_backend(DeviceKind::cpu, {2, 0});
  ModelOptions opts;
  opts.max_batch_tokens = 64;
  auto model = Model::load(model_dir, *backend, opts);
  const auto cases = test::read_golden_cases(golden_dir + "/golden.json");
  const auto golden = SafetensorsFile::open(golden_dir + "/golden.safetensors");
  REQUIRE(!cases.empty());
  const std::int64_t vocab = model->config().vocab_size;
  kv::KvCache cache(*backend, model->kv_spec(), {16, 16, 0});

  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const GoldenCase& c = cases[ci];
    INFO("case " << ci << " (" << c.prompt_ids.size() << " prompt tokens)");
    const auto n = static_cast<std::int32_t>(c.prompt_ids.size());
    kv::BlockTable table(16);
    table.ensure_capacity(cache.blocks(), n);
    const ForwardBatch b = test::prefill_batch(c.prompt_ids, table, c.logit_positions);
    Tensor logits = model->forward(b, cache);
    const auto rows = static_cast<std::size_t>(c.logit_positions.size());
    REQUIRE(logits.shape == Shape{static_cast<std::int64_t>(rows), vocab});
    std::vector<float> got(rows * static_cast<std::size_t>(vocab));
    backend->download(got.data(), logits);
    table.release(cache.blocks());

    const TensorInfo* want = golden.find(fmt::format("logits.{}", ci));
    REQUIRE(want);
    REQUIRE(want->shape == logits.shape);
    REQUIRE(want->dtype == DType::f32);
    const auto* ref = reinterpret_cast<const float*>(want->data);
    // Metric, per logits row: max |xserv - hf| <= tol * max |hf|.
    for (std::size_t r = 0; r < rows; ++r) {
      const auto [diff, scale] = test::row_error(got.data(), ref, r, vocab);
      INFO("row " << r << ": max diff " << diff << ", max |hf| " << scale);
      CHECK(diff <= tol * scale);
    }
  }
  if (!greedy) return;

  // Greedy continuations, all cases in one packed generate() call, eos ignored as HF's were.
  Engine engine(*model, nullptr);
  auto results = generate(engine, test::greedy_requests(cases));
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    INFO("greedy case " << ci);
    CHECK(results[ci].tokens == cases[ci].greedy_ids);
    CHECK(results[ci].finish == FinishReason::length);
  }
}

}  // namespace

TEST_CASE("tiny-gpt2 matches transformers", "[models][golden]") {
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-gpt2";
  check_golden(d, d);
}

TEST_CASE("tiny-qwen3 (GQA, head_dim != hidden/heads, untied) matches transformers",
          "[models][golden]") {
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-qwen3";
  check_golden(d, d);
}

TEST_CASE("tiny-qwen3-tied matches transformers", "[models][golden]") {
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-qwen3-tied";
  check_golden(d, d);
}

TEST_CASE("tiny-qwen3-bf16 (bf16 weights) matches transformers on upcast weights",
          "[models][golden]") {
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-qwen3-bf16";
  check_golden(d, d);
}

// The CPU backend's AMX prefill GEMM (on by default where the CPU has AMX; the test binaries turn
// it off unless asked, tests/main.cpp) rounds the activations to bf16 for bf16 weights, as
// transformers' own bf16 matmuls do: against the f32 reference the logits move by that rounding
// (measured with the emulated tiles: up to 0.85% of the row's largest logit), so the bound here
// is 2%, and the continuations are not compared (one of four flipped a near tie).
TEST_CASE(
    "tiny-qwen3-bf16 with the AMX bf16 prefill GEMM stays within bf16 rounding of transformers",
    "[models][golden]") {
  const test::ScopedEnv env("XSERV_CPU_AMX", cpu::amx_bf16_usable() ? "1" : "emulate");
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-qwen3-bf16";
  check_golden(d, d, 2e-2f, false);
}

// XSERV_CPU_KV=bf16 keeps the K/V cache of a bf16 model in bf16, as transformers' own bf16 run
// keeps it: against the f32 reference the logits move by that rounding, so the bound is the AMX
// case's 2%, and the continuations are not compared. f32 and f16 models keep f32, and a value
// other than f32 or bf16 is refused when the backend is made.
TEST_CASE("tiny-qwen3-bf16 with a bf16 K/V cache stays within bf16 rounding of transformers",
          "[models][golden]") {
  const test::ScopedEnv env("XSERV_CPU_KV", "bf16");
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-qwen3-bf16";
  {
    auto backend = make_backend(DeviceKind::cpu, {2, 0});
    auto model = Model::load(d, *backend, {});
    REQUIRE(model->kv_spec().dtype == DType::bf16);
    for (const char* other : {XSERV_TEST_DATA_DIR "/models/tiny-qwen3", XSERV_SOURCE_DIR "/examples/models/shakespeare"})
      CHECK(Model::load(other, *backend, {})->kv_spec().dtype == DType::f32);  // f32, f16 weights
  }
  check_golden(d, d, 2e-2f, false);
  const test::ScopedEnv bad("XSERV_CPU_KV", "f16");
  REQUIRE_THROWS_WITH(make_backend(DeviceKind::cpu, {2, 0}), Catch::Contains("XSERV_CPU_KV must be f32 or bf16"));
}

TEST_CASE("the embedded Shakespeare model matches transformers", "[models][golden]") {
  check_golden(XSERV_SOURCE_DIR "/examples/models/shakespeare",
               XSERV_TEST_DATA_DIR "/models/shakespeare");
}

TEST_CASE("GPT-2 with its Conv1D weights transposed instead of in panels matches transformers",
          "[models][golden]") {
  // XSERV_CPU_CONV1D=out_in (Model::conv1d_layout; f32 GPT-2 weights are in 32-column panels by
  // default): the out_in GEMV and the packed GEMM over transposed weights.
  const test::ScopedEnv env("XSERV_CPU_CONV1D", "out_in");
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-gpt2";
  check_golden(d, d);
}

TEST_CASE("GPT-2 with its Conv1D weights as stored still matches transformers",
          "[models][golden]") {
  // XSERV_CPU_CONV1D=in_out (Model::conv1d_layout; the CPU backend packs them into panels at
  // load by default): the in_out GEMV and GEMM packing read the checkpoint's own layout; the
  // tolerance is the golden one.
  const test::ScopedEnv env("XSERV_CPU_CONV1D", "in_out");
  const std::string d = XSERV_TEST_DATA_DIR "/models/tiny-gpt2";
  check_golden(d, d);
  check_golden(XSERV_SOURCE_DIR "/examples/models/shakespeare",
               XSERV_TEST_DATA_DIR "/models/shakespeare");
}
