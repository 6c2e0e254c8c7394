// Engine on the CPU backend: continuous batching gives each request exactly the ids it gives
// alone (greedy and seeded, across chunked prefill, preemption, prefix-cache hits, n > 1), plus
// stop rules, streaming text, limits, cancellation, errors and threads.
// Text tests use the embedded Shakespeare model (real GPT-2 tokenizer); id-only tests use the
// tiny-gpt2 / tiny-qwen3 fixtures.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "models/model.hpp"
#include "tokenizer/tokenizer.hpp"

using namespace xserv;

namespace {

const std::string kShakespeare = XSERV_SOURCE_DIR "/examples/models/shakespeare";
const std::string kTinyGpt2 = XSERV_TEST_DATA_DIR "/models/tiny-gpt2";
const std::string kTinyQwen3 = XSERV_TEST_DATA_DIR "/models/tiny-qwen3";

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

SamplingParams seeded(std::int32_t n, std::uint64_t seed) {
  SamplingParams p = greedy(n);
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = seed;
  return p;
}

std::vector<std::int32_t> iota_prompt(std::int32_t n, std::int32_t vocab, std::int32_t salt = 0) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i)
    t[static_cast<std::size_t>(i)] = (i * 31 + 7 + salt * 13) % vocab;
  return t;
}

// Every engine test runs twice (ENGINE_MODES): with synchronous steps, then with overlapped
// ("async") steps forced on for the CPU backend; the engines a test makes take the mode from
// small_blocks(). References (alone()) always step synchronously, so the second run checks the
// overlapped path against the synchronous one.
bool g_async_steps = false;

#define ENGINE_MODES()                            \
  g_async_steps = GENERATE(false, true);          \
  INFO("async steps " << g_async_steps)

EngineOptions small_blocks(std::int64_t kv_tokens = 4096) {
  EngineOptions o;
  o.block_size = 4;
  o.kv_cache_tokens = kv_tokens;
  o.async_steps = g_async_steps;
  return o;
}

// What one sample produced, gathered from its events.
struct Output {
  std::vector<std::int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
  ErrorCode status = ErrorCode::ok;
  std::string error;
  std::int32_t events = 0;
  std::int32_t cached_tokens = 0;
  std::int32_t completion_tokens = 0;
  std::vector<EngineEvent> all;
};

// Collects every event of the requests it is attached to, keyed by (request, sample).
struct Collector {
  std::map<std::pair<RequestId, std::int32_t>, Output> out;
  EventCallback callback() {
    return [this](const EngineEvent& e) {
      Output& o = out[{e.request, e.index}];
      if (e.type == EventType::token) o.tokens.push_back(e.token);
      o.text += e.text;
      ++o.events;
      o.all.push_back(e);
      if (e.finish != FinishReason::none) {
        o.finish = e.finish;
        o.status = e.status;
        o.error = e.error;
        o.cached_tokens = e.cached_tokens;
        o.completion_tokens = e.completion_tokens;
      }
    };
  }
  const Output& of(RequestId id, std::int32_t index = 0) { return out[{id, index}]; }
};

RequestId submit(Engine& engine, Collector& c, std::vector<std::int32_t> prompt,
                 const SamplingParams& params, std::int32_t n = 1, std::int32_t logprobs = 0) {
  EngineRequest r;
  r.prompt = std::move(prompt);
  r.params = params;
  r.n = n;
  r.logprobs = logprobs;
  r.on_event = c.callback();
  return engine.submit(std::move(r));
}

void run_to_end(Engine& engine) {
  for (int guard = 0; engine.has_work(); ++guard) {
    REQUIRE(guard < 100000);
    engine.step();
  }
}

// One request alone on a fresh engine with a roomy pool, stepping synchronously unless `async`.
Output alone(Model& model, const Tokenizer* tok, const std::vector<std::int32_t>& prompt,
             const SamplingParams& params, bool async = false) {
  EngineOptions o = small_blocks();
  o.async_steps = async;
  Engine engine(model, tok, o);
  Collector c;
  const RequestId id = submit(engine, c, prompt, params);
  run_to_end(engine);
  return c.of(id);
}

// 32 requests of different lengths (greedy and seeded), submitted over the first steps.
void check_staggered_equal_alone(Fixture& f, const EngineOptions& options, bool expect_preemption) {
  const std::int32_t vocab = f.model->config().vocab_size;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (std::int32_t i = 0; i < 32; ++i) {
    prompts.push_back(iota_prompt(1 + (i * 7) % 29, vocab, i));
    params.push_back(i % 2 ? seeded(4 + i % 9, 100 + static_cast<std::uint64_t>(i)) : greedy(4 + i % 9));
  }
  Engine engine(*f.model, nullptr, options);
  Collector c;
  std::vector<RequestId> ids;
  std::size_t next = 0;
  for (int step = 0; engine.has_work() || next < prompts.size(); ++step) {
    REQUIRE(step < 100000);
    // Two new requests every step while they last, mixed with running ones.
    for (int k = 0; k < 2 && next < prompts.size(); ++k, ++next)
      ids.push_back(submit(engine, c, prompts[next], params[next]));
    engine.step();
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i << " (" << prompts[i].size() << " prompt tokens)");
    const Output& got = c.of(ids[i]);
    const Output want = alone(*f.model, nullptr, prompts[i], params[i]);
    CHECK(got.tokens == want.tokens);
    CHECK(got.tokens.size() == static_cast<std::size_t>(params[i].max_tokens));
    CHECK(got.finish == FinishReason::length);
  }
  const EngineStats s = engine.stats();
  if (expect_preemption) CHECK(s.preemptions > 0);
  else CHECK(s.preemptions == 0);
  CHECK(s.kv_blocks_used == 0);
  CHECK(s.running == 0);
  CHECK(s.waiting == 0);
  // Steps carrying prompt chunks and pure decode steps both happened; the latter are a part.
  CHECK(s.decode_steps > 0);
  CHECK(s.decode_steps < s.steps);
  CHECK(s.decode_forward_seconds > 0.0);
  CHECK(s.decode_forward_seconds <= s.forward_seconds);
  // Requests come and go every few steps, yet some steps overlapped their predecessor.
  if (options.async_steps.value_or(false)) CHECK(s.overlapped_steps > 0);
  else CHECK(s.overlapped_steps == 0);
}

}  // namespace

TEST_CASE("Engine: 32 staggered requests give the ids each gives alone", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 16);  // 16 tokens per step: prompts are prefilled in chunks
  check_staggered_equal_alone(f, small_blocks(), false);
}

TEST_CASE("Engine: the same equality under a KV budget that forces preemption", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 16);
  // 48 tokens of KV for requests of up to 41 tokens: they take turns, preempting each other.
  EngineOptions o = small_blocks(48);
  o.prefix_cache = false;
  check_staggered_equal_alone(f, o, true);
  o.prefix_cache = true;  // recomputation may now hit blocks of its own earlier run
  check_staggered_equal_alone(f, o, true);
}

TEST_CASE("Engine: a Qwen3 model, staggered, equals alone", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyQwen3, 16);
  check_staggered_equal_alone(f, small_blocks(), false);
}

TEST_CASE("Engine: prefix-cache hits give the same ids as misses", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 64);
  const auto system = iota_prompt(37, 320, 3);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t q = 0; q < 4; ++q) {
    auto p = system;
    const auto tail = iota_prompt(3 + q, 320, 50 + q);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  EngineOptions off = small_blocks();
  off.prefix_cache = false;
  Engine cached(*f.model, nullptr, small_blocks()), uncached(*f.model, nullptr, off);
  Collector a, b;
  std::vector<RequestId> ia, ib;
  for (const auto& p : prompts) {  // one after the other: each later one finds the shared prefix
    ia.push_back(submit(cached, a, p, seeded(8, 7)));
    run_to_end(cached);
    ib.push_back(submit(uncached, b, p, seeded(8, 7)));
    run_to_end(uncached);
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK(a.of(ia[i]).tokens == b.of(ib[i]).tokens);
    CHECK(b.of(ib[i]).cached_tokens == 0);
    if (i > 0) CHECK(a.of(ia[i]).cached_tokens == 36);  // 9 full blocks of the shared 37
  }
  const EngineStats s = cached.stats();
  CHECK(s.prefix_hits >= 27);
  CHECK(s.prefix_hit_rate() > 0.5);
  CHECK(uncached.stats().prefix_queries == 0);
}

TEST_CASE("Engine: n samples share the prompt and equal requests with seed + i", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 64);
  const auto prompt = iota_prompt(21, 320, 9);
  Engine engine(*f.model, nullptr, small_blocks());
  Collector c;
  const RequestId id = submit(engine, c, prompt, seeded(10, 40), 4);
  engine.step();  // sample 0 computes the prompt
  engine.step();  // the others join, sharing its full prompt blocks
  CHECK(engine.stats().kv_blocks_used < 4 * 6);
  run_to_end(engine);
  for (std::int32_t i = 0; i < 4; ++i) {
    INFO("sample " << i);
    const Output want = alone(*f.model, nullptr, prompt, seeded(10, 40 + static_cast<std::uint64_t>(i)));
    CHECK(c.of(id, i).tokens == want.tokens);
    CHECK(c.of(id, i).finish == FinishReason::length);
  }
  CHECK(c.of(id, 1).tokens != c.of(id, 2).tokens);  // 10 draws from a random model
  CHECK(engine.stats().kv_blocks_used == 0);
}

TEST_CASE("Engine: cancel mid-run ends the request and frees its blocks", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 64);
  Engine engine(*f.model, nullptr, small_blocks());
  Collector c;
  const RequestId a = submit(engine, c, iota_prompt(30, 320), greedy(40));
  const RequestId b = submit(engine, c, iota_prompt(9, 320, 1), greedy(20));
  for (int i = 0; i < 5; ++i) engine.step();
  const std::int32_t used = engine.stats().kv_blocks_used;
  engine.cancel(a);
  engine.cancel(987654);  // unknown: ignored
  engine.step();
  CHECK(c.of(a).finish == FinishReason::cancelled);
  CHECK(c.of(a).tokens.size() == 5);
  CHECK(c.of(a).all.back().type == EventType::finished);
  CHECK(engine.stats().kv_blocks_used < used);
  run_to_end(engine);
  CHECK(c.of(b).tokens == alone(*f.model, nullptr, iota_prompt(9, 320, 1), greedy(20)).tokens);
  CHECK(engine.stats().kv_blocks_used == 0);
  engine.cancel(a);  // already ended: ignored
  CHECK_FALSE(engine.has_work());
}

TEST_CASE("Engine: overlapped steps give the synchronous events and drop the extra tokens of ended samples",
          "[engine]") {
  Fixture f(kTinyGpt2, 64);
  // Samples that end at different steps while others go on (stop ids taken from a first run,
  // eos, max_tokens, n > 1), all submitted at once: the overlapped engine launches a token for
  // a sample that its in-flight token ends, and must drop it.
  auto run = [&](bool async, const std::vector<SamplingParams>& params) {
    EngineOptions o = small_blocks();
    o.async_steps = async;
    Engine engine(*f.model, nullptr, o);
    Collector c;
    std::vector<RequestId> ids;
    for (std::size_t i = 0; i < params.size(); ++i)
      ids.push_back(submit(engine, c, iota_prompt(3 + static_cast<std::int32_t>(i), 320,
                                                  static_cast<std::int32_t>(i)),
                           params[i], i % 4 == 3 ? 2 : 1));
    run_to_end(engine);
    std::vector<Output> out;
    for (std::size_t i = 0; i < params.size(); ++i)
      for (std::int32_t k = 0; k < (i % 4 == 3 ? 2 : 1); ++k) out.push_back(c.of(ids[i], k));
    return std::make_pair(out, engine.stats());
  };
  std::vector<SamplingParams> params;
  for (std::int32_t i = 0; i < 10; ++i)
    params.push_back(i % 2 ? seeded(6 + 3 * i, 500 + static_cast<std::uint64_t>(i)) : greedy(6 + 3 * i));
  const auto first = run(false, params).first;
  std::size_t at = 0;
  for (std::int32_t i = 0; i < 10; ++i) {
    const Output& o = first[at];
    at += i % 4 == 3 ? 2 : 1;
    if (i % 3 == 0) params[static_cast<std::size_t>(i)].stop_token_ids = {o.tokens.at(o.tokens.size() / 2)};
    if (i % 3 == 1) params[static_cast<std::size_t>(i)].ignore_eos = false;
  }
  const auto [want, ws] = run(false, params);
  const auto [got, gs] = run(true, params);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("sample " << i);
    CHECK(got[i].tokens == want[i].tokens);
    CHECK(got[i].finish == want[i].finish);
    CHECK(got[i].events == want[i].events);
    CHECK(got[i].completion_tokens == want[i].completion_tokens);
  }
  CHECK(gs.generated_tokens == ws.generated_tokens);  // dropped tokens are not counted
  CHECK(gs.overlapped_steps > 0);
  CHECK(ws.overlapped_steps == 0);
  CHECK(gs.kv_blocks_used == 0);
  CHECK(gs.running == 0);
}

TEST_CASE("Engine: a request that can never fit fails alone", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 64);
  Engine engine(*f.model, nullptr, small_blocks(32));
  Collector c;
  const RequestId big = submit(engine, c, iota_prompt(40, 320), greedy(4));
  const RequestId small = submit(engine, c, iota_prompt(5, 320), greedy(4));
  run_to_end(engine);
  CHECK(c.of(big).finish == FinishReason::error);
  CHECK(c.of(big).status == ErrorCode::resource_exhausted);
  CHECK_THAT(c.of(big).error, Catch::Contains("KV blocks"));
  CHECK(c.of(small).finish == FinishReason::length);
  CHECK(c.of(small).tokens.size() == 4);
}

TEST_CASE("Engine: sampling options, seeds and penalties", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2);
  const auto prompt = iota_prompt(5, 320);
  auto run = [&](const SamplingParams& p) { return alone(*f.model, nullptr, prompt, p, g_async_steps).tokens; };
  SamplingParams p = greedy(12);
  p.temperature = 1.0f;
  p.seed = 1234;
  const auto a = run(p);
  CHECK(a.size() == 12);
  CHECK(run(p) == a);
  SamplingParams q = p;
  q.seed = 99;
  CHECK(run(q) != a);  // 12 draws from a random model: equal only by a fluke
  const auto g = run(greedy(12));
  SamplingParams k1 = p;
  k1.top_k = 1;
  CHECK(run(k1) == g);
  SamplingParams p0 = p;
  p0.top_p = 1e-6f;
  CHECK(run(p0) == g);
  SamplingParams m1 = p;
  m1.min_p = 1.0f;
  CHECK(run(m1) == g);
  // A strong repetition penalty steers greedy decoding away from tokens already seen.
  SamplingParams rep = greedy(12);
  rep.repetition_penalty = 100.0f;
  const auto r = run(rep);
  for (auto id : r) CHECK(std::count(r.begin(), r.end(), id) == 1);
  for (auto id : r) CHECK(std::find(prompt.begin(), prompt.end(), id) == prompt.end());
}

TEST_CASE("Engine: max_tokens, stop ids, eos and the context end a sample", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2);
  const auto prompt = iota_prompt(4, 320);
  const Output full = alone(*f.model, nullptr, prompt, greedy(16));  // the reference: synchronous
  REQUIRE(full.tokens.size() == 16);
  CHECK(full.finish == FinishReason::length);
  CHECK(full.events == 16);
  CHECK(full.completion_tokens == 16);

  // Nothing to generate: still one final event with a finish reason.
  const Output none = alone(*f.model, nullptr, prompt, greedy(0), g_async_steps);
  CHECK(none.tokens.empty());
  CHECK(none.events == 1);
  CHECK(none.finish == FinishReason::length);
  CHECK(none.all.at(0).type == EventType::finished);
  const std::int32_t ctx = f.model->config().max_position_embeddings;  // 128
  const Output at_ctx = alone(*f.model, nullptr, iota_prompt(ctx, 320), greedy(10), g_async_steps);
  CHECK(at_ctx.tokens.empty());
  CHECK(at_ctx.finish == FinishReason::length);
  const Output near_ctx = alone(*f.model, nullptr, iota_prompt(ctx - 3, 320), greedy(10), g_async_steps);
  CHECK(near_ctx.tokens.size() == 3);
  CHECK(near_ctx.finish == FinishReason::length);

  SamplingParams stop = greedy(16);
  stop.stop_token_ids = {full.tokens[6]};
  const Output s = alone(*f.model, nullptr, prompt, stop, g_async_steps);
  const auto first = std::find(full.tokens.begin(), full.tokens.end(), full.tokens[6]);
  CHECK(s.tokens == std::vector<std::int32_t>(full.tokens.begin(), first + 1));
  CHECK(s.finish == FinishReason::stop);

  Engine engine(*f.model, nullptr, small_blocks());
  REQUIRE(engine.eos_token_ids() == std::vector<std::int32_t>{319});
  SamplingParams eos = greedy(16);
  eos.ignore_eos = false;
  const Output e = alone(*f.model, nullptr, prompt, eos, g_async_steps);
  const auto at = std::find(full.tokens.begin(), full.tokens.end(), 319);
  CHECK(e.tokens == std::vector<std::int32_t>(full.tokens.begin(), at == full.tokens.end() ? at : at + 1));
}

TEST_CASE("Engine: submit rejects bad requests with a clear error", "[engine]") {
  Fixture f(kTinyGpt2);
  Engine engine(*f.model, nullptr, small_blocks());
  Collector c;
  auto code = [&](std::vector<std::int32_t> prompt, SamplingParams p, std::int32_t n = 1,
                  std::int32_t logprobs = 0) {
    try {
      submit(engine, c, std::move(prompt), p, n, logprobs);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::ok;
  };
  const std::int32_t ctx = f.model->config().max_position_embeddings;
  CHECK(code({}, greedy(4)) == ErrorCode::invalid_argument);
  CHECK(code({1, 320}, greedy(4)) == ErrorCode::invalid_argument);
  CHECK(code(iota_prompt(ctx + 5, 320), greedy(4)) == ErrorCode::invalid_argument);
  SamplingParams bad = greedy(4);
  bad.top_p = 0;
  CHECK(code({1}, bad) == ErrorCode::invalid_argument);
  CHECK(code({1}, greedy(4), 0) == ErrorCode::invalid_argument);
  CHECK(code({1}, greedy(4), 1, 21) == ErrorCode::invalid_argument);
  SamplingParams strings = greedy(4);
  strings.stop_strings = {"x"};
  CHECK(code({1}, strings) == ErrorCode::invalid_argument);  // no tokenizer
  CHECK_FALSE(engine.has_work());

  EngineOptions capped = small_blocks();
  capped.max_waiting = 1;
  Engine queue(*f.model, nullptr, capped);
  submit(queue, c, {1, 2}, greedy(2));
  CHECK_THROWS_AS(submit(queue, c, {1, 2}, greedy(2)), Error);
  EngineOptions wrong = small_blocks();
  wrong.block_size = 0;
  CHECK_THROWS_AS(Engine(*f.model, nullptr, wrong), Error);
}

TEST_CASE("Engine: decode batches padded for graph replay give the same tokens", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2);
  EngineOptions padded = small_blocks(), plain = small_blocks();
  padded.pad_decode_batches = true;
  plain.pad_decode_batches = false;
  // Seven requests ending after 2..14 tokens: decode steps of 7, 6, ... 1 sequences, padded to
  // 8, 8, 8, 4, 4, 2, 1 (padding rows write and read the null block).
  auto run = [&](const EngineOptions& o) {
    Engine engine(*f.model, nullptr, o);
    Collector c;
    std::vector<RequestId> ids;
    for (std::int32_t i = 0; i < 7; ++i)
      ids.push_back(submit(engine, c, iota_prompt(3 + 2 * i, 320), i == 3 ? seeded(2 + 2 * i, 11) : greedy(2 + 2 * i)));
    run_to_end(engine);
    std::vector<std::vector<std::int32_t>> out;
    for (auto id : ids) out.push_back(c.of(id).tokens);
    return std::make_pair(out, engine.stats());
  };
  const auto [a, sa] = run(padded);
  const auto [b, sb] = run(plain);
  for (std::size_t i = 0; i < 7; ++i) {
    INFO("request " << i);
    CHECK(a[i] == b[i]);
    CHECK(a[i].size() == 2 + 2 * i);
  }
  CHECK(sa.generated_tokens == sb.generated_tokens);  // padding rows are not counted as work
  CHECK(sa.kv_blocks_used == 0);
}

TEST_CASE("Engine: log-probabilities of the chosen tokens and the top ones", "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyQwen3);
  Engine engine(*f.model, nullptr, small_blocks());
  Collector c;
  SamplingParams p = greedy(6);
  p.repetition_penalty = 1.3f;  // logprobs are of the raw logits, before penalties
  const RequestId id = submit(engine, c, iota_prompt(7, 320), p, 1, 5);
  const RequestId plain = submit(engine, c, iota_prompt(7, 320), greedy(6));
  run_to_end(engine);
  const Output& o = c.of(id);
  REQUIRE(o.all.size() == 6);
  for (const EngineEvent& e : o.all) {
    REQUIRE(e.top_logprobs.size() == 5);
    CHECK(e.logprob <= 0.0f);
    float mass = 0.0f;
    for (std::size_t k = 0; k < 5; ++k) {
      CHECK(e.top_logprobs[k].logprob <= 0.0f);
      if (k > 0) CHECK(e.top_logprobs[k].logprob <= e.top_logprobs[k - 1].logprob);
      mass += std::exp(e.top_logprobs[k].logprob);
      if (e.top_logprobs[k].token == e.token) CHECK(e.top_logprobs[k].logprob == e.logprob);
    }
    CHECK(mass <= 1.0001f);
  }
  for (const EngineEvent& e : c.of(plain).all) {
    CHECK(e.top_logprobs.empty());
    CHECK(e.logprob == 0.0f);
  }
  // Without penalties the greedy token is the most likely one.
  Collector g;
  const RequestId gid = submit(engine, g, iota_prompt(7, 320), greedy(3), 1, 2);
  run_to_end(engine);
  for (const EngineEvent& e : g.of(gid).all) {
    CHECK(e.top_logprobs.at(0).token == e.token);
    CHECK(e.top_logprobs.at(0).logprob == e.logprob);
  }
}

TEST_CASE("Engine: streamed text, stop strings held back and cut", "[engine]") {
  ENGINE_MODES();
  Fixture f(kShakespeare);
  const Tokenizer tok = Tokenizer::load(kShakespeare);
  const auto prompt = tok.encode("ROMEO:\n");
  const Output full = alone(*f.model, &tok, prompt, greedy(40));
  REQUIRE(full.tokens.size() == 40);
  CHECK(full.text == tok.decode(full.tokens));
  REQUIRE(full.text.size() > 20);

  // A stop string made of the end of one token's text and the start of the next one's.
  const std::string first_one =
      tok.decode(std::vector<std::int32_t>(full.tokens.begin(), full.tokens.begin() + 7));
  const std::string stop = full.text.substr(first_one.size() - 1, 2);
  const std::size_t at = full.text.find(stop);
  REQUIRE(at != std::string::npos);
  SamplingParams p = greedy(40);
  p.stop_strings = {"this will never appear \x01", stop};
  const Output r = alone(*f.model, &tok, prompt, p, g_async_steps);
  CHECK(r.finish == FinishReason::stop);
  CHECK(r.text == full.text.substr(0, at));
  CHECK(r.text.find(stop) == std::string::npos);

  // A partial match that never completes is released by the end of generation.
  SamplingParams q = greedy(6);
  const std::string tail =
      tok.decode(std::vector<std::int32_t>(full.tokens.begin(), full.tokens.begin() + 6));
  q.stop_strings = {tail.substr(tail.size() - 1) + "\x01never"};
  const Output t = alone(*f.model, &tok, prompt, q, g_async_steps);
  CHECK(t.finish == FinishReason::length);
  CHECK(t.text == tail);
}

TEST_CASE("Engine: events without a callback go to poll, and a background thread steps",
          "[engine]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2);
  const auto want = alone(*f.model, nullptr, iota_prompt(6, 320), greedy(5)).tokens;
  for (bool background : {false, true}) {
    INFO("background " << background);
    EngineOptions o = small_blocks();
    o.background_thread = background;
    Engine engine(*f.model, nullptr, o);
    EngineRequest r;
    r.prompt = iota_prompt(6, 320);
    r.params = greedy(5);
    const RequestId id = engine.submit(r);
    std::vector<std::int32_t> got;
    bool finished = false;
    for (int spin = 0; !finished && spin < 2000000; ++spin) {
      if (!background) engine.step();
      EngineEvent e;
      while (engine.poll(e)) {
        CHECK(e.request == id);
        got.push_back(e.token);
        finished = e.finish != FinishReason::none;
      }
      if (background) std::this_thread::yield();
    }
    CHECK(finished);
    CHECK(got == want);
    if (background) CHECK_THROWS_AS(engine.step(), Error);
  }
}

TEST_CASE("Engine: 8 threads submit and cancel while one thread steps", "[engine][threads]") {
  ENGINE_MODES();
  Fixture f(kTinyGpt2, 32);
  Engine engine(*f.model, nullptr, small_blocks(256));
  std::mutex m;
  std::map<RequestId, FinishReason> finished;
  std::atomic<int> submitted{0};
  std::atomic<bool> done_submitting{false};
  EventCallback on_event = [&](const EngineEvent& e) {
    if (e.finish == FinishReason::none) return;
    std::lock_guard lock(m);
    finished[e.request] = e.finish;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 12; ++i) {
        EngineRequest r;
        r.prompt = iota_prompt(2 + (t * 5 + i) % 17, 320, t);
        r.params = greedy(3 + i % 5);
        r.on_event = on_event;
        const RequestId id = engine.submit(std::move(r));
        ++submitted;
        if (i % 3 == 0) engine.cancel(id);
        (void)engine.stats();
        (void)engine.has_work();
      }
    });
  }
  std::thread stepper([&] {
    while (!done_submitting.load() || engine.has_work()) engine.step();
  });
  for (auto& t : threads) t.join();
  done_submitting = true;
  stepper.join();
  CHECK(submitted.load() == 96);
  CHECK(finished.size() == 96);
  for (const auto& [id, reason] : finished)
    CHECK((reason == FinishReason::length || reason == FinishReason::cancelled));
  CHECK(engine.stats().kv_blocks_used == 0);
  CHECK_FALSE(engine.has_work());
}

TEST_CASE("Engine: a tokenizer with ids past the embedding is refused", "[engine]") {
  Fixture f(kTinyGpt2);  // 320 embedding rows
  const Tokenizer gpt2 = Tokenizer::load(kShakespeare);  // the GPT-2 tokenizer: 50257 ids
  try {
    Engine engine(*f.model, &gpt2, small_blocks());
    FAIL("the engine accepted a 50257-id tokenizer for 320 rows");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::format);
    CHECK(std::string(e.what()).find("50256") != std::string::npos);
  }
  Engine ids_only(*f.model, nullptr, small_blocks());  // prompts as ids: nothing to check
  CHECK_FALSE(ids_only.has_work());
}
