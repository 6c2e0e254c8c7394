// libFuzzer target: the engine through the C ABI, as a host drives it, on the embedded model
// (examples/models/shakespeare, CPU). Each input is a short session on one long-lived engine (a
// small KV pool, so requests preempt one another, and small steps, so prompts are chunked): up
// to four requests with arbitrary prompts (text that may be invalid UTF-8, token ids that may be
// out of range or past the context, a conversation the model has no template for, none or
// several at once) and arbitrary sampling and stopping parameters (NaN, infinities, negative or
// huge values, stop strings and ids of any kind, n and logprobs out of range), then steps with
// cancels between them, then everything cancelled and drained.
//
// Every call must answer with a status (submit: OK, INVALID_ARGUMENT, UNSUPPORTED or
// RESOURCE_EXHAUSTED with a message; step, poll, cancel, stats: OK), and every event must hold
// together: a request and sample this input submitted, a token in the vocabulary, valid UTF-8
// text of the stated length, log-probabilities that are probabilities' logs in descending order,
// and exactly one ending per sample, within its max_tokens. When the session is drained the
// engine has no work, nothing running or waiting and no KV block in use. Anything else (a crash,
// a sanitizer report, an abort below) is a finding.
//
// Built by the `fuzz` preset (tests/fuzz/CMakeLists.txt): scripts/fuzz.sh ci 20 engine
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/utf8.hpp"
#include "xserv.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

xserv_model* g_model = nullptr;
xserv_engine* g_engine = nullptr;
std::int32_t g_vocab = 0;

// A float that is usually in or near a parameter's range and sometimes anything at all.
float some_float(FuzzedDataProvider& fdp) {
  static const float table[] = {0.0f, 0.5f, 1.0f, 2.0f, 100.0f, 101.0f, -1.0f, -2.5f, 1e-30f, 1e30f,
                                std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity()};
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0: return fdp.PickValueInArray(table);
    case 1: return fdp.ConsumeFloatingPointInRange(-3.0f, 3.0f);
    case 2: return fdp.ConsumeFloatingPoint<float>();
    default: return 1.0f;
  }
}

struct Sample {
  int endings = 0;
  int tokens = 0;
};

struct Submitted {
  xserv_request_id id = 0;
  std::int32_t n = 1;
  std::int32_t logprobs = 0;
  std::int32_t max_tokens = 0;
  std::vector<Sample> samples;
};

struct Session {
  std::map<xserv_request_id, Submitted> requests;

  void check(const xserv_event& e) {
    auto it = requests.find(e.request);
    require(it != requests.end());
    Submitted& r = it->second;
    require(e.index >= 0 && e.index < r.n);
    Sample& s = r.samples[static_cast<std::size_t>(e.index)];
    require(s.endings == 0);  // nothing after a sample's end
    require(e.type == XSERV_EVENT_TOKEN || e.type == XSERV_EVENT_FINISHED);
    require(e.text != nullptr && std::strlen(e.text) == e.text_len && xserv::utf8::is_valid({e.text, e.text_len}));
    require(e.error != nullptr);
    if (e.type == XSERV_EVENT_TOKEN) {
      require(e.token >= 0 && e.token < g_vocab);
      ++s.tokens;
      if (r.logprobs > 0) {
        require(e.n_top_logprobs == static_cast<std::size_t>(r.logprobs) && e.top_logprobs != nullptr);
        require(!std::isnan(e.logprob) && e.logprob <= 1e-4f);
        for (std::size_t k = 0; k < e.n_top_logprobs; ++k) {
          const xserv_top_logprob& t = e.top_logprobs[k];
          require(t.token >= 0 && t.token < g_vocab && !std::isnan(t.logprob) && t.logprob <= 1e-4f);
          if (k > 0) require(t.logprob <= e.top_logprobs[k - 1].logprob);
        }
      } else {
        require(e.n_top_logprobs == 0);
      }
    } else {
      require(e.token == -1 && e.finish != XSERV_FINISH_NONE);
    }
    if (e.finish != XSERV_FINISH_NONE) {
      ++s.endings;
      require(s.tokens <= r.max_tokens);
      require(e.completion_tokens == s.tokens);
      require(e.prompt_tokens >= 1 && e.cached_tokens >= 0 && e.cached_tokens <= e.prompt_tokens);
      require((e.status == XSERV_OK) == (e.finish != XSERV_FINISH_ERROR));
    }
    if (e.status != XSERV_OK) require(e.finish == XSERV_FINISH_ERROR && e.error[0] != '\0');
  }

  void drain() {
    for (;;) {
      xserv_event e;
      bool got = false;
      require(xserv_engine_poll(g_engine, &e, &got) == XSERV_OK);
      if (!got) return;
      check(e);
    }
  }
};

void submit(FuzzedDataProvider& fdp, Session& session) {
  xserv_request r;
  xserv_request_init(&r);
  xserv_generate_params p = xserv_generate_default_params();
  std::string text;
  std::vector<std::int32_t> tokens;
  xserv_chat_message message{"user", "hello"};
  switch (fdp.ConsumeIntegralInRange(0, 5)) {
    case 0:  // text, any bytes
      text = fdp.ConsumeRandomLengthString(160);
      r.prompt = text.c_str();
      break;
    case 1:
    case 2: {  // token ids: mostly in the vocabulary, now and then not; up to past the context
      const std::size_t n = fdp.ConsumeIntegralInRange<std::size_t>(0, fdp.ConsumeBool() ? 24 : 300);
      for (std::size_t i = 0; i < n && fdp.remaining_bytes() > 0; ++i)
        tokens.push_back(fdp.ConsumeIntegralInRange(0, 15) == 0 ? fdp.ConsumeIntegral<std::int32_t>()
                                                                : fdp.ConsumeIntegralInRange(0, g_vocab - 1));
      r.prompt_tokens = tokens.data();
      r.n_prompt_tokens = tokens.size();
      break;
    }
    case 3:  // a conversation: the embedded model has no chat template
      r.messages = &message;
      r.n_messages = 1;
      break;
    case 4:  // two prompts at once
      r.prompt = "To be";
      r.messages = &message;
      r.n_messages = 1;
      break;
    default:  // none
      break;
  }
  p.max_tokens = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange(0, 8) : fdp.ConsumeIntegral<std::int32_t>();
  p.temperature = fdp.ConsumeBool() ? 0.0f : some_float(fdp);
  p.top_k = fdp.ConsumeBool() ? 0 : fdp.ConsumeIntegral<std::int32_t>();
  p.top_p = fdp.ConsumeBool() ? 1.0f : some_float(fdp);
  p.min_p = fdp.ConsumeBool() ? 0.0f : some_float(fdp);
  p.repetition_penalty = fdp.ConsumeBool() ? 1.0f : some_float(fdp);
  p.presence_penalty = fdp.ConsumeBool() ? 0.0f : some_float(fdp);
  p.frequency_penalty = fdp.ConsumeBool() ? 0.0f : some_float(fdp);
  p.seed = fdp.ConsumeIntegral<std::uint64_t>();
  p.ignore_eos = fdp.ConsumeBool();
  std::vector<std::string> stops;
  for (int i = fdp.ConsumeIntegralInRange(0, 3); i > 0; --i) stops.push_back(fdp.ConsumeRandomLengthString(8));
  std::vector<const char*> stop_ptrs;
  for (const auto& s : stops) stop_ptrs.push_back(s.c_str());
  p.stop_strings = stop_ptrs.data();
  p.n_stop_strings = stop_ptrs.size();
  std::vector<std::int32_t> stop_ids;
  for (int i = fdp.ConsumeIntegralInRange(0, 3); i > 0; --i)
    stop_ids.push_back(fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange(0, g_vocab - 1) : fdp.ConsumeIntegral<std::int32_t>());
  p.stop_tokens = stop_ids.data();
  p.n_stop_tokens = stop_ids.size();
  r.params = fdp.ConsumeIntegralInRange(0, 7) == 0 ? nullptr : &p;
  r.n = fdp.ConsumeIntegralInRange(0, 7) == 0 ? fdp.ConsumeIntegral<std::int32_t>() : fdp.ConsumeIntegralInRange(1, 3);
  r.logprobs = fdp.ConsumeIntegralInRange(0, 7) == 0 ? fdp.ConsumeIntegral<std::int32_t>() : fdp.ConsumeIntegralInRange(0, 3);

  xserv_request_id id = 0;
  const xserv_status st = xserv_engine_submit(g_engine, &r, &id);
  if (st != XSERV_OK) {
    require(st == XSERV_ERR_INVALID_ARGUMENT || st == XSERV_ERR_UNSUPPORTED || st == XSERV_ERR_RESOURCE_EXHAUSTED);
    require(xserv_last_error() != nullptr && xserv_last_error()[0] != '\0');
    return;
  }
  require(id != 0 && session.requests.count(id) == 0);
  Submitted s;
  s.id = id;
  s.n = r.n;
  s.logprobs = r.logprobs;
  s.max_tokens = r.params != nullptr ? p.max_tokens : xserv_generate_default_params().max_tokens;
  require(s.n >= 1 && s.n <= 64 && s.logprobs >= 0 && s.logprobs <= 20 && s.max_tokens >= 0);
  s.samples.resize(static_cast<std::size_t>(s.n));
  session.requests.emplace(id, std::move(s));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  xserv_model_params mp = xserv_model_default_params();
  mp.device = XSERV_DEVICE_CPU;
  mp.n_threads = 1;
  require(xserv_model_load(XSERV_SOURCE_DIR "/examples/models/shakespeare", &mp, &g_model) == XSERV_OK);
  g_vocab = xserv_model_n_vocab(g_model);
  xserv_engine_params ep = xserv_engine_default_params();
  ep.max_seqs = 4;
  ep.max_batch_tokens = 64;   // prompts in chunks
  ep.kv_cache_tokens = 512;   // two full contexts: requests preempt one another
  ep.max_waiting = 3;         // a fourth request at once meets submit's RESOURCE_EXHAUSTED
  require(xserv_engine_create(g_model, &ep, &g_engine) == XSERV_OK);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Session session;
  for (int i = fdp.ConsumeIntegralInRange(1, 4); i > 0; --i) submit(fdp, session);
  // Steps, each maybe preceded by a cancel of a submitted request or an unknown id.
  for (int step = fdp.ConsumeIntegralInRange(0, 24); step > 0 && xserv_engine_has_work(g_engine); --step) {
    if (fdp.ConsumeIntegralInRange(0, 3) == 0 && !session.requests.empty()) {
      auto it = session.requests.begin();
      std::advance(it, fdp.ConsumeIntegralInRange<std::size_t>(0, session.requests.size() - 1));
      require(xserv_engine_cancel(g_engine, fdp.ConsumeBool() ? it->first : it->first + 1000000) == XSERV_OK);
    }
    std::size_t n_events = 0;
    require(xserv_engine_step(g_engine, &n_events) == XSERV_OK);
    session.drain();
  }
  // The host gives up: everything cancelled, the engine stepped until idle.
  for (const auto& kv : session.requests) require(xserv_engine_cancel(g_engine, kv.first) == XSERV_OK);
  for (int step = 0; xserv_engine_has_work(g_engine); ++step) {
    require(step < 64);
    require(xserv_engine_step(g_engine, nullptr) == XSERV_OK);
  }
  session.drain();
  for (const auto& kv : session.requests)
    for (const Sample& s : kv.second.samples) require(s.endings == 1);
  xserv_engine_stats st{};
  st.struct_size = sizeof st;
  require(xserv_engine_get_stats(g_engine, &st) == XSERV_OK);
  require(st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0);
  return 0;
}
