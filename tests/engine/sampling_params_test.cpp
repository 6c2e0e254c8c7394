#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "engine/sampling_params.hpp"
#include "io/model_config.hpp"
#include "support/temp_dir.hpp"

using namespace xserv;

namespace {
void expect_invalid(const SamplingParams& p, const char* field) {
  try {
    p.validate();
    FAIL("expected invalid_argument for " << field);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains(field));
  }
}
}  // namespace

TEST_CASE("SamplingParams rejects absurd values naming the field", "[engine]") {
  SamplingParams ok;
  ok.validate();
  ok.temperature = 0.0f;  // greedy
  ok.top_p = 1.0f;
  ok.max_tokens = 0;
  ok.validate();

  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](auto f) {
    SamplingParams p;
    f(p);
    return p;
  };
  expect_invalid(with([](SamplingParams& p) { p.temperature = -0.5f; }), "temperature");
  expect_invalid(with([&](SamplingParams& p) { p.temperature = nan; }), "temperature");
  expect_invalid(with([](SamplingParams& p) { p.top_k = -1; }), "top_k");
  expect_invalid(with([](SamplingParams& p) { p.top_p = 0.0f; }), "top_p");
  expect_invalid(with([](SamplingParams& p) { p.top_p = 1.5f; }), "top_p");
  expect_invalid(with([](SamplingParams& p) { p.min_p = 2.0f; }), "min_p");
  expect_invalid(with([](SamplingParams& p) { p.repetition_penalty = 0.0f; }), "repetition_penalty");
  expect_invalid(with([](SamplingParams& p) { p.presence_penalty = 5.0f; }), "presence_penalty");
  expect_invalid(with([&](SamplingParams& p) { p.frequency_penalty = nan; }), "frequency_penalty");
  expect_invalid(with([](SamplingParams& p) { p.max_tokens = -3; }), "max_tokens");
  expect_invalid(with([](SamplingParams& p) { p.stop_strings = {""}; }), "stop string");
  expect_invalid(with([](SamplingParams& p) { p.stop_token_ids = {-2}; }), "stop token");
}

TEST_CASE("SamplingParams::row carries every field to the backend", "[engine]") {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_k = 5;
  p.top_p = 0.9f;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.5f;
  CHECK(p.uses_penalties());
  SamplingRow r = p.row(42, 3);
  CHECK(r.temperature == 0.7f);
  CHECK(r.top_k == 5);
  CHECK(r.top_p == 0.9f);
  CHECK(r.min_p == 0.05f);
  CHECK(r.repetition_penalty == 1.1f);
  CHECK(r.presence_penalty == 0.5f);
  CHECK(r.frequency_penalty == -0.5f);
  CHECK(r.seed == 42);
  CHECK(r.step == 3);
  CHECK_FALSE(SamplingParams{}.uses_penalties());
}

TEST_CASE("eos ids come from config.json and generation_config.json", "[engine]") {
  test::TempDir dir;
  ModelConfig c;
  c.eos_token_ids = {50256};
  CHECK(load_eos_token_ids(dir.path().string(), c) == std::vector<std::int32_t>{50256});
  dir.write("generation_config.json", R"({"eos_token_id": [151645, 50256, 151643]})");
  CHECK(load_eos_token_ids(dir.path().string(), c) ==
        std::vector<std::int32_t>{50256, 151643, 151645});
  dir.write("generation_config.json", R"({"eos_token_id": 7})");
  CHECK(load_eos_token_ids(dir.path().string(), c) == std::vector<std::int32_t>{7, 50256});
  dir.write("generation_config.json", R"({"eos_token_id": "x"})");
  CHECK_THROWS_AS(load_eos_token_ids(dir.path().string(), c), Error);
  dir.write("generation_config.json", R"({"temperature": 0.6})");
  CHECK(load_eos_token_ids(dir.path().string(), c) == std::vector<std::int32_t>{50256});
}
