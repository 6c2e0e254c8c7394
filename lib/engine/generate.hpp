// Blocking generation over an Engine: submit, step from this thread until the requests end.
//
// The one-call paths (xserv_generate, `xserv-cli generate` and `chat`, the golden tests, the
// generate benchmark) use these instead of a loop of their own: there is one generation loop in
// the codebase, Engine::step(). The engine must not be stepped by another thread meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.hpp"

namespace xserv {

struct GenerationRequest {
  std::vector<std::int32_t> prompt;
  SamplingParams params;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // generated ids; an eos/stop id that ended it is included
  std::string text;                  // the emitted text: no stop string, no stop-id text
  FinishReason finish = FinishReason::none;
  std::int32_t prompt_tokens = 0;
  std::int32_t cached_tokens = 0;
};

// One event of one request. token is -1 on a final event without a token of its own (max_tokens
// 0, a prompt that fills the context, a cancelled request). The last event has finish != none.
struct TokenEvent {
  std::size_t sequence = 0;  // index into the requests
  std::int32_t token = 0;
  std::string_view text;
  FinishReason finish = FinishReason::none;
};
// Returns false to stop that request (finish reason "cancelled"; no further event reaches it).
using TokenCallback = std::function<bool(const TokenEvent&)>;

// Wall time of the steps of the last generate() call, split by whether a step computed prompt
// tokens (prefill) or only decodes.
struct GenerationStats {
  std::int64_t prefill_tokens = 0;
  double prefill_seconds = 0;
  std::int64_t decode_tokens = 0;
  double decode_seconds = 0;
  std::int64_t steps = 0;
};

// Options for an engine that runs one request at a time: one sequence, a KV pool of one context.
EngineOptions single_sequence_options(const Model& model);

// Runs the requests to their ends (all submitted at once: they batch). Throws what submit()
// throws, and Error(status) when a request fails. `stats` (may be null) receives the timing.
std::vector<GenerationResult> generate(Engine& engine, std::span<const GenerationRequest> requests,
                                       const TokenCallback& on_token = {},
                                       GenerationStats* stats = nullptr);
GenerationResult generate(Engine& engine, const std::vector<std::int32_t>& prompt,
                          const SamplingParams& params, const TokenCallback& on_token = {},
                          GenerationStats* stats = nullptr);

}  // namespace xserv
