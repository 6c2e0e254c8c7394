#include "engine/generate.hpp"

#include <chrono>
#include <map>

#include "core/error.hpp"

namespace xserv {

EngineOptions single_sequence_options(const Model& model) {
  EngineOptions o;
  o.max_seqs = 1;
  o.kv_cache_tokens = model.config().max_position_embeddings + o.block_size;
  return o;
}

std::vector<GenerationResult> generate(Engine& engine, std::span<const GenerationRequest> requests,
                                       const TokenCallback& on_token, GenerationStats* stats) {
  std::vector<GenerationResult> results(requests.size());
  std::vector<bool> stopped(requests.size(), false);
  std::map<RequestId, std::size_t> index;
  std::size_t open = requests.size();
  ErrorCode error = ErrorCode::ok;
  std::string error_message;

  auto on_event = [&](const EngineEvent& e) {
    const std::size_t i = index.at(e.request);
    GenerationResult& r = results[i];
    if (e.finish != FinishReason::none) {
      --open;
      r.prompt_tokens = e.prompt_tokens;
      r.cached_tokens = e.cached_tokens;
      if (e.status != ErrorCode::ok && error == ErrorCode::ok) {
        error = e.status;
        error_message = e.error;
      }
    }
    if (stopped[i]) return;  // the caller said stop: its finish stays "cancelled"
    if (e.type == EventType::token) r.tokens.push_back(e.token);
    r.text += e.text;
    if (e.finish != FinishReason::none) r.finish = e.finish;
    if (on_token && e.status == ErrorCode::ok &&
        !on_token(TokenEvent{i, e.token, e.text, e.finish}) && e.finish == FinishReason::none) {
      stopped[i] = true;
      r.finish = FinishReason::cancelled;
      engine.cancel(e.request);
    }
  };

  // Every request is submitted before the first step, so index is complete when events come.
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EngineRequest req;
    req.prompt = requests[i].prompt;
    req.params = requests[i].params;
    req.on_event = on_event;
    index[engine.submit(std::move(req))] = i;
  }
  using Clock = std::chrono::steady_clock;
  GenerationStats s;
  EngineStats before = engine.stats();
  while (open > 0) {
    const auto t0 = Clock::now();
    engine.step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const EngineStats after = engine.stats();
    const auto prompt = static_cast<std::int64_t>(after.prompt_tokens - before.prompt_tokens);
    if (prompt > 0) {
      s.prefill_tokens += prompt;
      s.prefill_seconds += dt;
    } else {
      s.decode_tokens += static_cast<std::int64_t>(after.generated_tokens - before.generated_tokens);
      s.decode_seconds += dt;
    }
    s.steps += static_cast<std::int64_t>(after.steps - before.steps);
    before = after;
  }
  if (stats) *stats = s;
  if (error != ErrorCode::ok) throw Error(error, error_message);
  return results;
}

GenerationResult generate(Engine& engine, const std::vector<std::int32_t>& prompt,
                          const SamplingParams& params, const TokenCallback& on_token,
                          GenerationStats* stats) {
  const GenerationRequest req{prompt, params};
  return std::move(generate(engine, std::span<const GenerationRequest>(&req, 1), on_token, stats)[0]);
}

}  // namespace xserv
