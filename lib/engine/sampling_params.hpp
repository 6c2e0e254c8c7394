// SamplingParams: how one request picks its tokens and when it stops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "io/model_config.hpp"

namespace xserv {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax)
  std::int32_t top_k = 0;    // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;  // HF semantics over prompt + output; 1: off
  float presence_penalty = 0.0f;    // OpenAI semantics over the output; 0: off
  float frequency_penalty = 0.0f;   // OpenAI semantics over the output; 0: off
  // Same seed, same prompt, same model: same output. nullopt draws a fresh seed per request.
  std::optional<std::uint64_t> seed;
  std::int32_t max_tokens = 16;  // generated tokens at most (also bounded by the context)
  std::vector<std::int32_t> stop_token_ids;  // extra stop ids (emitted in ids, not as text)
  std::vector<std::string> stop_strings;     // generation ends before the first match
  bool ignore_eos = false;  // keep going past the model's eos ids

  // Throws Error(invalid_argument) naming the field for absurd values (negative or NaN
  // temperature, top_p outside (0, 1], a penalty outside its range, max_tokens < 0, empty stop
  // strings, ...).
  void validate() const;
  bool uses_penalties() const noexcept {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // The backend's per-row parameters for draw number `step` with the resolved seed.
  SamplingRow row(std::uint64_t seed_value, std::uint64_t step) const noexcept;
};

// The model's end-of-sequence ids: config.json's eos_token_id plus generation_config.json's (int
// or list) when that file exists, without duplicates.
std::vector<std::int32_t> load_eos_token_ids(const std::string& model_dir,
                                             const ModelConfig& config);

}  // namespace xserv
