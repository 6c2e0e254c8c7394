// Generator: runs one or several prompts to completion on a Model.
//
// Each step packs work for every running sequence into one ForwardBatch under the model's token
// budget — decodes first (one token each), then prompt chunks (so prompts longer than the budget
// are prefilled in pieces, mixed with other sequences' decodes) — runs one forward, samples one
// token per sequence that finished its prompt on the backend, and applies the stop rules on the
// host. KV blocks are reserved for a sequence's whole run when it is admitted; a sequence waits
// while the pool is short. This is the simple loop before the engine issue's scheduler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampling_params.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"

namespace xserv {

class Tokenizer;

enum class FinishReason : std::uint8_t {
  none,       // still running
  stop,       // an eos id, a stop id or a stop string
  length,     // max_tokens or the model's context limit
  cancelled,  // the token callback asked to stop
};
std::string_view finish_reason_name(FinishReason r) noexcept;  // "stop", "length", ...

struct GenerationRequest {
  std::vector<std::int32_t> prompt;
  SamplingParams params;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // generated ids; an eos/stop id that ended it is included
  std::string text;                  // the emitted text: no stop string, no stop-id text
  FinishReason finish = FinishReason::none;
  std::int32_t prompt_tokens = 0;
};

// One generated token of one sequence. `text` is the text that became safe to show with it (it
// may be empty: an unfinished UTF-8 character, or text that may start a stop string, is held
// back). The last event of a sequence has finish != none.
struct TokenEvent {
  std::size_t sequence = 0;  // index into the requests
  std::int32_t token = 0;
  std::string_view text;
  FinishReason finish = FinishReason::none;
};
// Returns false to stop that sequence (finish reason "cancelled").
using TokenCallback = std::function<bool(const TokenEvent&)>;

struct GeneratorOptions {
  std::int32_t block_size = 16;
  // KV pool: 0 sizes it (grow only) for each generate() call's requests; > 0 fixes it once.
  std::size_t kv_memory_bytes = 0;
  // Pure decode steps padded to 1, 2, 4 or a multiple of 8 sequences, so a backend that records
  // graphs (CUDA) keeps one recording per padded size instead of one per batch size as
  // sequences finish. The padding rows attend to themselves in a KV block set aside for them
  // and are sampled nowhere. Unset: on when the backend records graphs.
  std::optional<bool> pad_decode_batches;
};

// Wall time of the last generate() call, split by whether a step held prompt tokens.
struct GenerationStats {
  std::int64_t prefill_tokens = 0;  // prompt tokens run
  double prefill_seconds = 0;       // steps with prompt tokens
  std::int64_t decode_tokens = 0;   // tokens run in steps without prompt tokens
  double decode_seconds = 0;
  std::int64_t steps = 0;
};

class Generator {
 public:
  // The tokenizer (may be null: no text, no stop strings) must outlive the generator.
  Generator(Model& model, const Tokenizer* tokenizer, const GeneratorOptions& options = {});
  ~Generator();

  // Throws Error(invalid_argument) for bad params, an empty prompt, a token outside the vocab or
  // a prompt longer than max_position_embeddings (naming both numbers); Error(resource_exhausted)
  // when one sequence needs more KV blocks than a fixed pool has.
  std::vector<GenerationResult> generate(std::span<const GenerationRequest> requests,
                                         const TokenCallback& on_token = {});
  GenerationResult generate(const std::vector<std::int32_t>& prompt, const SamplingParams& params,
                            const TokenCallback& on_token = {});

  const std::vector<std::int32_t>& eos_token_ids() const noexcept { return eos_ids_; }
  const GenerationStats& last_stats() const noexcept { return stats_; }
  Model& model() noexcept { return model_; }

 private:
  struct Sequence;
  void ensure_cache(std::int64_t blocks_needed, std::int64_t largest);
  std::int32_t blocks_for(const Sequence& s) const noexcept;

  Model& model_;
  const Tokenizer* tokenizer_;
  GeneratorOptions options_;
  std::vector<std::int32_t> eos_ids_;
  std::unique_ptr<kv::KvCache> cache_;
  // Pure decode steps go through Backend::run_graph keyed by (cache_epoch_, padded size); each KV
  // pool gets a process-unique epoch since recordings hold its addresses. A replay returns no
  // tensor, so the logits view of each recorded size is kept (the model's workspace, never moved).
  std::uint64_t cache_epoch_ = 0;
  std::map<std::size_t, Tensor> decode_logits_;
  GenerationStats stats_;
};

}  // namespace xserv
