// The C++ engine API (xserv::Engine in include/xserv/xserv.hpp) as a user sees it: linked
// against libxserv only, compiled as C++17. The reference for the engine's text is the blocking
// Model::generate (xserv_generate) with the same greedy options.
#include <xserv/xserv.hpp>

#include "cxx_check.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

xserv::GenerateOptions greedy(int max_tokens) {
  xserv::GenerateOptions o;
  o.temperature = 0;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return o;
}

xserv::EngineOptions small_engine() {
  xserv::EngineOptions eo;
  eo.max_seqs = 8;
  eo.kv_cache_tokens = 8 * 256;
  return eo;
}

void run_until_idle(xserv::Engine& engine) {
  for (int i = 0; i < 10000 && engine.has_work(); ++i) engine.step();
}

// What one sample produced through the events.
struct Sample {
  std::string text;
  int tokens = 0;
  xserv::Event last;
  bool ended = false;
};

// async_steps: the overlapped steps (forced on here, off by default on the CPU) give the same text.
void test_callback_matches_generate(xserv::Model& model, int async_steps) {
  const std::string reference = model.generate("ROMEO:", greedy(24));
  xserv::EngineOptions eo = small_engine();
  eo.async_steps = async_steps;
  eo.max_prefill_tokens = 4;  // the prompt in chunks of 4: same ids
  xserv::Engine engine(model, eo);
  Sample s;
  xserv::Request r;
  r.prompt = "ROMEO:";
  r.options = greedy(24);
  r.on_event = [&](const xserv::Event& e) {
    s.text += e.text;
    if (e.type == xserv::EventType::token) ++s.tokens;
    if (e.ends_sample()) {
      s.last = e;
      s.ended = true;
    }
  };
  const xserv::RequestId id = engine.submit(r);
  CHECK(id != 0);
  CHECK(engine.has_work());
  run_until_idle(engine);
  CHECK(s.ended);
  CHECK(s.text == reference);
  CHECK(s.tokens == 24);
  CHECK(s.last.finish == xserv::FinishReason::length);
  CHECK(s.last.request == id);
  CHECK(s.last.completion_tokens == 24);
  CHECK(s.last.prompt_tokens == static_cast<int>(model.tokenize("ROMEO:", false).size()));
  const xserv::EngineStats st = engine.stats();
  CHECK(st.steps > 0);
  CHECK(st.generated_tokens >= 24);
  CHECK(st.running == 0 && st.waiting == 0);
  CHECK(st.kv_blocks_total > 0);
}

void test_poll_tokens_and_logprobs(xserv::Model& model) {
  xserv::Engine engine(model, small_engine());
  xserv::Request r;
  r.prompt_tokens = model.tokenize("JULIET:", false);
  r.options = greedy(8);
  r.logprobs = 3;
  const xserv::RequestId id = engine.submit(r);
  run_until_idle(engine);
  Sample s;
  int with_top = 0;
  while (std::optional<xserv::Event> e = engine.poll()) {
    CHECK(e->request == id);
    s.text += e->text;
    if (e->type == xserv::EventType::token) {
      ++s.tokens;
      if (e->top_logprobs.size() == 3 && e->top_logprobs[0].token == e->token &&
          e->logprob <= 0.0f && e->top_logprobs[0].logprob >= e->top_logprobs[1].logprob)
        ++with_top;
    }
    if (e->ends_sample()) s.ended = true;
  }
  CHECK(s.ended);
  CHECK(s.tokens == 8);
  CHECK(with_top == 8);  // greedy: the sampled token is the most likely one
  CHECK(s.text == model.generate("JULIET:", greedy(8)));
}

void test_n_cancel_and_errors(xserv::Model& model) {
  xserv::Engine engine(model, small_engine());
  // n samples: n ends, each with its own index.
  std::vector<int> ended(3, 0);
  xserv::Request r;
  r.prompt = "ROMEO:";
  r.options = greedy(6);
  r.options.temperature = 1.0f;
  r.options.seed = 3;
  r.n = 3;
  r.on_event = [&](const xserv::Event& e) {
    if (e.ends_sample() && e.index >= 0 && e.index < 3) ++ended[static_cast<std::size_t>(e.index)];
  };
  engine.submit(r);
  run_until_idle(engine);
  CHECK(ended == std::vector<int>({1, 1, 1}));

  // Cancel a long request after a few steps.
  xserv::FinishReason finish = xserv::FinishReason::none;
  xserv::Request longer;
  longer.prompt = "ROMEO:";
  longer.options = greedy(200);
  longer.on_event = [&](const xserv::Event& e) {
    if (e.ends_sample()) finish = e.finish;
  };
  const xserv::RequestId id = engine.submit(longer);
  for (int i = 0; i < 3; ++i) engine.step();
  engine.cancel(id);
  run_until_idle(engine);
  CHECK(finish == xserv::FinishReason::cancelled);
  engine.cancel(id);  // finished: ignored
  engine.cancel(123456789);

  // Bad requests throw at submit with the C status.
  CHECK(status_of([&] { engine.submit(xserv::Request{}); }) == XSERV_ERR_INVALID_ARGUMENT);
  xserv::Request both;
  both.prompt = "a";
  both.prompt_tokens = {1};
  CHECK(status_of([&] { engine.submit(both); }) == XSERV_ERR_INVALID_ARGUMENT);
  xserv::Request too_long;
  too_long.prompt_tokens.assign(static_cast<std::size_t>(model.n_ctx()) + 8, 198);
  CHECK(status_of([&] { engine.submit(too_long); }) == XSERV_ERR_INVALID_ARGUMENT);
  xserv::Request chat;
  chat.messages = {{"user", "hi"}};
  CHECK(status_of([&] { engine.submit(chat); }) == XSERV_ERR_UNSUPPORTED);  // no chat template

  // An exception thrown by a callback comes out of step().
  xserv::Request throws;
  throws.prompt = "ROMEO:";
  throws.options = greedy(2);
  bool thrown = false;
  throws.on_event = [&thrown](const xserv::Event&) {
    if (!std::exchange(thrown, true)) throw std::runtime_error("from the callback");
  };
  engine.submit(throws);
  bool rethrown = false;
  try {
    run_until_idle(engine);
  } catch (const std::runtime_error& e) {
    rethrown = std::string(e.what()) == "from the callback";
  }
  CHECK(rethrown);
  run_until_idle(engine);

  // Moved engines keep working; the moved-from one is empty.
  xserv::Engine moved = std::move(engine);
  Sample s;
  xserv::Request again;
  again.prompt = "ROMEO:";
  again.options = greedy(4);
  again.on_event = [&](const xserv::Event& e) { s.text += e.text; };
  moved.submit(again);
  run_until_idle(moved);
  CHECK(s.text == model.generate("ROMEO:", greedy(4)));
}

void test_background_thread(xserv::Model& model) {
  xserv::EngineOptions eo = small_engine();
  eo.background_thread = true;
  xserv::Engine engine(model, eo);
  std::mutex m;
  std::condition_variable cv;
  std::string text;
  bool done = false;
  xserv::Request r;
  r.prompt = "ROMEO:";
  r.options = greedy(10);
  r.on_event = [&](const xserv::Event& e) {
    std::lock_guard<std::mutex> lock(m);
    text += e.text;
    if (e.ends_sample()) {
      done = true;
      cv.notify_one();
    }
  };
  engine.submit(r);
  std::unique_lock<std::mutex> lock(m);
  CHECK(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; }));
  CHECK(text == model.generate("ROMEO:", greedy(10)));
}

}  // namespace

int main() {
  try {
    xserv::ModelOptions mo;
    mo.device = xserv::Device::cpu;
    xserv::Model model = xserv::Model::load(kModel, mo);
    CHECK(status_of([&] {
            xserv::EngineOptions bad;
            bad.max_seqs = -1;
            xserv::Engine e(model, bad);
          }) == XSERV_ERR_INVALID_ARGUMENT);
    CHECK(status_of([&] {
            xserv::EngineOptions bad;
            bad.async_steps = 2;
            xserv::Engine e(model, bad);
          }) == XSERV_ERR_INVALID_ARGUMENT);
    test_callback_matches_generate(model, 0);
    test_callback_matches_generate(model, 1);
    test_poll_tokens_and_logprobs(model);
    test_n_cancel_and_errors(model);
    test_background_thread(model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return 1;
  }
  return report_checks("engine_cpp_test");
}
