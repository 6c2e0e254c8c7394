// The engine's request and event records (internal C++; capi/xserv.h mirrors them for C).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "engine/sampling_params.hpp"

namespace xserv {

using RequestId = std::uint64_t;

enum class FinishReason : std::uint8_t {
  none,       // still running
  stop,       // an eos id, a stop id or a stop string
  length,     // max_tokens or the model's context limit
  cancelled,  // cancelled by the host
  error,      // the request failed (EngineEvent::status says why)
};
std::string_view finish_reason_name(FinishReason r) noexcept;  // "stop", "length", ...

struct TopLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
};

enum class EventType : std::uint8_t {
  token = 1,     // a generated token; finish != none on a sample's last one
  finished = 2,  // a sample ended without a token of its own (cancel, error, max_tokens 0, ...)
};

struct EngineEvent {
  EventType type = EventType::token;
  RequestId request = 0;
  std::int32_t index = 0;  // which sample
  std::int32_t token = -1;
  std::string text;        // text that became safe to show with this event
  float logprob = 0.0f;
  std::vector<TopLogprob> top_logprobs;
  FinishReason finish = FinishReason::none;
  ErrorCode status = ErrorCode::ok;
  std::string error;
  // Usage, on the event that ends a sample.
  std::int32_t prompt_tokens = 0;
  std::int32_t cached_tokens = 0;
  std::int32_t completion_tokens = 0;
};

// Called on the stepping thread for each event of its request. It may call Engine::submit and
// Engine::cancel; it must not call Engine::step.
using EventCallback = std::function<void(const EngineEvent&)>;

struct EngineRequest {
  std::vector<std::int32_t> prompt;  // token ids, at least one
  SamplingParams params;
  // Independent samples sharing the prompt's blocks. Sample i draws with seed + i (a request
  // without a seed draws one base seed), so sample i equals a request of its own with seed + i.
  std::int32_t n = 1;
  std::int32_t logprobs = 0;  // top log-probabilities per token, 0 ..= 20 (0: none)
  EventCallback on_event;     // empty: events go to Engine::poll
};

}  // namespace xserv
