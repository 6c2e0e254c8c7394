// Generator on the CPU backend: sampling determinism, stop rules, limits, streaming, batching.
// Text tests use the embedded Shakespeare model (real GPT-2 tokenizer); id-only tests use the
// tiny-gpt2 fixture.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "engine/generator.hpp"
#include "models/model.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace xserv;

namespace {

const std::string kShakespeare = XSERV_SOURCE_DIR "/examples/models/shakespeare";
const std::string kTinyGpt2 = XSERV_TEST_DATA_DIR "/models/tiny-gpt2";

struct Fixture {
  std::unique_ptr<Backend> backend = make_backend(DeviceKind::cpu, {2, 0});
  std::unique_ptr<Model> model;
  explicit Fixture(const std::string& dir, std::int32_t max_batch_tokens = 64) {
    ModelOptions o;
    o.max_batch_tokens = max_batch_tokens;
    model = Model::load(dir, *backend, o);
  }
};

SamplingParams greedy(std::int32_t n) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

std::vector<std::int32_t> iota_prompt(std::int32_t n, std::int32_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 31 + 7) % vocab;
  return t;
}

}  // namespace

TEST_CASE("Generator: same seed, same output, and top_k 1 and tiny top_p are greedy", "[engine]") {
  Fixture f(kTinyGpt2);
  Generator gen(*f.model, nullptr);
  const auto prompt = iota_prompt(5, 320);
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 12;
  p.ignore_eos = true;
  p.seed = 1234;
  auto a = gen.generate(prompt, p);
  auto b = gen.generate(prompt, p);
  CHECK(a.tokens.size() == 12);
  CHECK(a.tokens == b.tokens);
  p.seed = 99;
  auto c = gen.generate(prompt, p);
  CHECK(c.tokens != a.tokens);  // 12 draws from a random model: equal only by a fluke

  auto g = gen.generate(prompt, greedy(12));
  SamplingParams k1 = p;
  k1.top_k = 1;
  CHECK(gen.generate(prompt, k1).tokens == g.tokens);
  SamplingParams p0 = p;
  p0.top_p = 1e-6f;
  CHECK(gen.generate(prompt, p0).tokens == g.tokens);
  SamplingParams m1 = p;
  m1.min_p = 1.0f;
  CHECK(gen.generate(prompt, m1).tokens == g.tokens);

  // A strong repetition penalty steers greedy decoding away from tokens already seen.
  SamplingParams rep = greedy(12);
  rep.repetition_penalty = 100.0f;
  auto r = gen.generate(prompt, rep);
  for (auto id : r.tokens) CHECK(std::count(r.tokens.begin(), r.tokens.end(), id) == 1);
  for (auto id : r.tokens) CHECK(std::find(prompt.begin(), prompt.end(), id) == prompt.end());
}

TEST_CASE("Generator: max_tokens, stop ids, eos and the callback end a sequence", "[engine]") {
  Fixture f(kTinyGpt2);
  Generator gen(*f.model, nullptr);
  const auto prompt = iota_prompt(4, 320);
  auto full = gen.generate(prompt, greedy(16));
  REQUIRE(full.tokens.size() == 16);
  CHECK(full.finish == FinishReason::length);
  CHECK(gen.generate(prompt, greedy(0)).tokens.empty());

  SECTION("stop id: included in the ids, generation ends there") {
    SamplingParams p = greedy(16);
    p.stop_token_ids = {full.tokens[6]};
    auto r = gen.generate(prompt, p);
    const auto first = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[6]);
    CHECK(r.tokens == std::vector<std::int32_t>(full.tokens.begin(), first + 1));
    CHECK(r.finish == FinishReason::stop);
  }
  SECTION("eos from generation_config.json unless ignore_eos") {
    REQUIRE(gen.eos_token_ids() == std::vector<std::int32_t>{319});
    SamplingParams p = greedy(16);
    p.ignore_eos = false;
    auto r = gen.generate(prompt, p);
    auto eos = std::find(full.tokens.begin(), full.tokens.end(), 319);
    CHECK(r.tokens == std::vector<std::int32_t>(full.tokens.begin(),
                                                eos == full.tokens.end() ? eos : eos + 1));
  }
  SECTION("the callback stops generation") {
    int calls = 0;
    auto r = gen.generate(prompt, greedy(16), [&](const TokenEvent& e) {
      CHECK(e.sequence == 0);
      CHECK(e.token == full.tokens[static_cast<std::size_t>(calls)]);
      return ++calls < 3;
    });
    CHECK(calls == 3);
    CHECK(r.tokens.size() == 3);
    CHECK(r.finish == FinishReason::cancelled);
  }
}

TEST_CASE("Generator: the context limit", "[engine]") {
  Fixture f(kTinyGpt2);
  Generator gen(*f.model, nullptr);
  const std::int32_t ctx = f.model->config().max_position_embeddings;  // 128
  try {
    gen.generate(iota_prompt(ctx + 5, 320), greedy(4));
    FAIL("expected invalid_argument");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains(std::to_string(ctx + 5)) && Catch::Contains(std::to_string(ctx)));
  }
  auto r = gen.generate(iota_prompt(ctx - 3, 320), greedy(10));
  CHECK(r.tokens.size() == 3);  // prompt + generated reaches the context: a normal "length" end
  CHECK(r.finish == FinishReason::length);
  auto full = gen.generate(iota_prompt(ctx, 320), greedy(10));
  CHECK(full.tokens.empty());
  CHECK(full.finish == FinishReason::length);
  CHECK_THROWS_AS(gen.generate(std::vector<std::int32_t>{}, greedy(4)), Error);
  CHECK_THROWS_AS(gen.generate(std::vector<std::int32_t>{1, 320}, greedy(4)), Error);
  SamplingParams bad = greedy(4);
  bad.top_p = 0;
  CHECK_THROWS_AS(gen.generate(iota_prompt(3, 320), bad), Error);
}

TEST_CASE("Generator: several prompts at once equal each alone, across chunked prefill and a "
          "small KV pool",
          "[engine]") {
  Fixture f(kTinyGpt2, 8);  // 8 tokens per forward: prompts are prefilled in chunks
  GeneratorOptions small;
  small.block_size = 4;
  // Room for about two sequences at once: the others wait for blocks.
  small.kv_memory_bytes = f.model->kv_spec().bytes_per_block(4) * 24;
  Generator gen(*f.model, nullptr, small);
  Generator alone(*f.model, nullptr);
  std::vector<GenerationRequest> reqs;
  for (std::int32_t n : {19, 1, 6, 13}) reqs.push_back({iota_prompt(n, 320), greedy(10)});
  reqs[2].params.temperature = 0.8f;
  reqs[2].params.seed = 5;
  std::vector<std::size_t> events(reqs.size(), 0);
  auto results = gen.generate(reqs, [&](const TokenEvent& e) {
    ++events[e.sequence];
    return true;
  });
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i);
    CHECK(results[i].tokens == alone.generate(reqs[i].prompt, reqs[i].params).tokens);
    CHECK(results[i].tokens.size() == 10);
    CHECK(events[i] == 10);
    CHECK(results[i].prompt_tokens == static_cast<std::int32_t>(reqs[i].prompt.size()));
  }
  CHECK(gen.last_stats().prefill_tokens == 19 + 1 + 6 + 13);

  GeneratorOptions tiny;
  tiny.block_size = 4;
  tiny.kv_memory_bytes = f.model->kv_spec().bytes_per_block(4) * 2;
  Generator starved(*f.model, nullptr, tiny);
  try {
    starved.generate(iota_prompt(19, 320), greedy(10));
    FAIL("expected resource_exhausted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::resource_exhausted);
  }
}

TEST_CASE("Generator: decode batches padded for graph replay give the same tokens", "[engine]") {
  Fixture f(kTinyGpt2);
  GeneratorOptions padded, plain;
  padded.pad_decode_batches = true;
  plain.pad_decode_batches = false;
  Generator with(*f.model, nullptr, padded), without(*f.model, nullptr, plain);
  // Seven sequences ending after 2..14 tokens: decode steps of 7, 6, ... 1 sequences, padded
  // to 8, 8, 8, 4, 4, 2, 1.
  std::vector<GenerationRequest> reqs;
  for (std::int32_t i = 0; i < 7; ++i) reqs.push_back({iota_prompt(3 + 2 * i, 320), greedy(2 + 2 * i)});
  reqs[3].params.temperature = 0.9f;
  reqs[3].params.seed = 11;
  const auto a = with.generate(reqs);
  const auto b = without.generate(reqs);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    INFO("request " << i);
    CHECK(a[i].tokens == b[i].tokens);
    CHECK(a[i].tokens.size() == static_cast<std::size_t>(reqs[i].params.max_tokens));
  }
  // Padding rows are not counted as work.
  CHECK(with.last_stats().decode_tokens == without.last_stats().decode_tokens);

  // A fixed pool exactly as large as the largest sequence leaves no block for padding rows:
  // generation runs unpadded instead of starving.
  GeneratorOptions exact = padded;
  exact.block_size = 4;
  exact.kv_memory_bytes = f.model->kv_spec().bytes_per_block(4) * 4;  // 16 tokens
  Generator tight(*f.model, nullptr, exact);
  const auto c = tight.generate(iota_prompt(6, 320), greedy(10));
  CHECK(c.tokens == without.generate(iota_prompt(6, 320), greedy(10)).tokens);
}

TEST_CASE("Generator: streamed text, stop strings held back and cut", "[engine]") {
  Fixture f(kShakespeare);
  const Tokenizer tok = Tokenizer::load(kShakespeare);
  Generator gen(*f.model, &tok);
  const auto prompt = tok.encode("ROMEO:\n");
  std::string streamed;
  auto full = gen.generate(prompt, greedy(40), [&](const TokenEvent& e) {
    streamed += e.text;
    return true;
  });
  REQUIRE(full.tokens.size() == 40);
  CHECK(streamed == full.text);
  CHECK(full.text == tok.decode(full.tokens));
  REQUIRE(full.text.size() > 20);

  // A stop string made of the end of one token's text and the start of the next one's.
  std::string first_two = tok.decode(std::vector<std::int32_t>(full.tokens.begin(), full.tokens.begin() + 8));
  std::string first_one = tok.decode(std::vector<std::int32_t>(full.tokens.begin(), full.tokens.begin() + 7));
  REQUIRE(first_two.size() > first_one.size());
  const std::string stop = full.text.substr(first_one.size() - 1, 2);
  const std::size_t at = full.text.find(stop);
  REQUIRE(at != std::string::npos);

  SamplingParams p = greedy(40);
  p.stop_strings = {"this will never appear \x01", stop};
  std::vector<std::string> pieces;
  auto r = gen.generate(prompt, p, [&](const TokenEvent& e) {
    pieces.emplace_back(e.text);
    return true;
  });
  CHECK(r.finish == FinishReason::stop);
  CHECK(r.text == full.text.substr(0, at));
  std::string joined;
  for (const auto& s : pieces) joined += s;
  CHECK(joined == r.text);
  CHECK(joined.find(stop) == std::string::npos);

  // A partial match that never completes is released by the end of generation.
  SamplingParams q = greedy(6);
  const std::string tail = tok.decode(std::vector<std::int32_t>(full.tokens.begin(), full.tokens.begin() + 6));
  q.stop_strings = {tail.substr(tail.size() - 1) + "\x01never"};
  auto t = gen.generate(prompt, q);
  CHECK(t.finish == FinishReason::length);
  CHECK(t.text == tail);

  SamplingParams no_tok = greedy(3);
  no_tok.stop_strings = {"x"};
  Generator ids_only(*f.model, nullptr);
  CHECK_THROWS_AS(ids_only.generate(prompt, no_tok), Error);
}
