#include "engine/generator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <random>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv {

namespace {
// Decode recordings (Backend::run_graph) hold a KV pool's addresses, and a later pool of this or
// another Generator on the same backend may land at the same address: every pool gets a
// process-unique epoch, part of the recording's key.
std::uint64_t next_cache_epoch() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// The padded size of a decode step of n sequences: 1, 2, 4, then multiples of 8.
std::int32_t padded_decode_size(std::int32_t n) noexcept {
  if (n <= 2) return n;
  if (n <= 4) return 4;
  return (n + 7) / 8 * 8;
}
}  // namespace

std::string_view finish_reason_name(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "unknown";
}

struct Generator::Sequence {
  std::size_t index = 0;
  const SamplingParams* params = nullptr;
  GenerationResult* result = nullptr;
  std::vector<std::int32_t> tokens;  // prompt, then generated ids
  std::int32_t prompt_len = 0;
  std::int32_t limit = 0;     // tokens (prompt + generated) this sequence may reach
  std::int32_t computed = 0;  // tokens whose K/V are in the cache
  std::uint64_t seed = 0;
  kv::BlockTable table{16};
  bool admitted = false;
  bool done = false;
  std::optional<StreamDecoder> decoder;
  std::string text;          // decoded text so far (cut at a stop string)
  std::size_t emitted = 0;   // bytes of `text` already handed out
  // The step's share of the batch.
  std::int32_t step_tokens = 0;
  bool step_logits = false;

  std::int32_t pending() const noexcept {
    return static_cast<std::int32_t>(tokens.size()) - computed;
  }
  std::int32_t generated() const noexcept {
    return static_cast<std::int32_t>(tokens.size()) - prompt_len;
  }
};

namespace {

// Earliest match of any stop string that ends past byte `from` of `text` (matches ending
// earlier were found by earlier calls); npos when none.
std::size_t find_stop(const std::string& text, std::size_t from,
                      const std::vector<std::string>& stops) {
  std::size_t best = std::string::npos;
  for (const auto& s : stops) {
    std::size_t start = from >= s.size() - 1 ? from - (s.size() - 1) : 0;
    std::size_t p = text.find(s, start);
    if (p != std::string::npos) best = std::min(best, p);
  }
  return best;
}

// Length of the longest suffix of text[emitted..] that is a proper prefix of a stop string: the
// bytes that must be held back because the next token may complete a match.
std::size_t held_suffix(const std::string& text, std::size_t emitted,
                        const std::vector<std::string>& stops) {
  std::size_t held = 0;
  const std::size_t avail = text.size() - emitted;
  for (const auto& s : stops) {
    for (std::size_t len = std::min(avail, s.size() - 1); len > held; --len) {
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        held = len;
        break;
      }
    }
  }
  return held;
}

}  // namespace

Generator::Generator(Model& model, const Tokenizer* tokenizer, const GeneratorOptions& options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  XSERV_CHECK(options.block_size > 0 && options.block_size <= 1024, ErrorCode::invalid_argument,
              "generator: block size {}", options.block_size);
  eos_ids_ = load_eos_token_ids(model.dir(), model.config());
  if (options.kv_memory_bytes > 0) {
    cache_ = std::make_unique<kv::KvCache>(
        model.backend(), model.kv_spec(),
        kv::KvCacheOptions{options.block_size, 0, options.kv_memory_bytes});
    cache_epoch_ = next_cache_epoch();
  }
}

Generator::~Generator() = default;

std::int32_t Generator::blocks_for(const Sequence& s) const noexcept {
  return (s.limit + options_.block_size - 1) / options_.block_size;
}

void Generator::ensure_cache(std::int64_t blocks_needed, std::int64_t largest) {
  if (options_.kv_memory_bytes > 0) {
    XSERV_CHECK(largest <= cache_->num_blocks(), ErrorCode::resource_exhausted,
                "generator: a sequence needs {} KV blocks but the pool holds {}", largest,
                cache_->num_blocks());
    return;
  }
  if (cache_ && cache_->num_blocks() >= blocks_needed) return;
  cache_.reset();  // free the old pool before taking the larger one
  cache_epoch_ = next_cache_epoch();
  cache_ = std::make_unique<kv::KvCache>(
      model_.backend(), model_.kv_spec(),
      kv::KvCacheOptions{options_.block_size, static_cast<std::int32_t>(blocks_needed), 0});
}

GenerationResult Generator::generate(const std::vector<std::int32_t>& prompt,
                                     const SamplingParams& params, const TokenCallback& on_token) {
  GenerationRequest req{prompt, params};
  return std::move(generate(std::span<const GenerationRequest>(&req, 1), on_token)[0]);
}

std::vector<GenerationResult> Generator::generate(std::span<const GenerationRequest> requests,
                                                  const TokenCallback& on_token) {
  const ModelConfig& cfg = model_.config();
  const std::int32_t max_pos = cfg.max_position_embeddings;
  std::vector<GenerationResult> results(requests.size());
  std::vector<Sequence> seqs(requests.size());
  stats_ = {};

  std::int64_t blocks_total = 0, blocks_largest = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    r.params.validate();
    const auto n = static_cast<std::int64_t>(r.prompt.size());
    XSERV_CHECK(n > 0, ErrorCode::invalid_argument, "generate: prompt {} is empty", i);
    XSERV_CHECK(n <= max_pos, ErrorCode::invalid_argument,
                "generate: prompt {} has {} tokens, more than the model's context of {} "
                "(max_position_embeddings)",
                i, n, max_pos);
    for (auto id : r.prompt)
      XSERV_CHECK(id >= 0 && id < cfg.vocab_size, ErrorCode::invalid_argument,
                  "generate: prompt {} holds token {} outside the vocab of {}", i, id,
                  cfg.vocab_size);
    XSERV_CHECK(r.params.stop_strings.empty() || tokenizer_, ErrorCode::invalid_argument,
                "generate: stop strings need a tokenizer");
    Sequence& s = seqs[i];
    s.index = i;
    s.params = &r.params;
    s.result = &results[i];
    s.tokens = r.prompt;
    s.prompt_len = static_cast<std::int32_t>(n);
    s.limit = static_cast<std::int32_t>(std::min<std::int64_t>(n + r.params.max_tokens, max_pos));
    s.seed = r.params.seed ? *r.params.seed : std::random_device{}() * 0x100000001ull;
    s.table = kv::BlockTable(options_.block_size);
    if (tokenizer_) s.decoder.emplace(*tokenizer_);
    results[i].prompt_tokens = s.prompt_len;
    if (s.limit <= s.prompt_len) {  // nothing to generate: max_tokens 0 or a full context
      s.done = true;
      results[i].finish = FinishReason::length;
      continue;
    }
    blocks_total += blocks_for(s);
    blocks_largest = std::max<std::int64_t>(blocks_largest, blocks_for(s));
  }
  if (blocks_total == 0) return results;
  Backend& backend = model_.backend();
  const bool pad = options_.pad_decode_batches.value_or(backend.records_graphs());
  ensure_cache(blocks_total + (pad ? 1 : 0), blocks_largest);

  // Whatever happens (a callback throwing included), every block goes back to the pool.
  struct Release {
    std::vector<Sequence>& seqs;
    kv::BlockAllocator& pool;
    std::int32_t padding_block = -1;
    ~Release() {
      for (auto& s : seqs) s.table.release(pool);
      if (padding_block >= 0) pool.free(padding_block);
    }
  } release{seqs, cache_->blocks()};
  // The padding rows' block; only when every sequence still fits in the rest of the pool (a
  // fixed pool may be exactly as large as the largest sequence: then no padding).
  if (pad && blocks_largest < cache_->num_blocks() && cache_->blocks().num_free() > 0)
    release.padding_block = cache_->blocks().allocate();
  const std::int32_t padding_block = release.padding_block;

  ForwardBatch batch;
  SamplingBatch sampling;
  std::vector<Sequence*> order;
  std::vector<std::int32_t> sampled;
  using Clock = std::chrono::steady_clock;

  for (;;) {
    // Admit waiting sequences, in order, while their whole run fits in the free blocks.
    for (auto& s : seqs) {
      if (s.done || s.admitted) continue;
      if (cache_->blocks().num_free() < blocks_for(s)) break;
      s.table.ensure_capacity(cache_->blocks(), s.limit);
      s.admitted = true;
    }
    // Decodes first (one token each, never starved by long prompts), then prompt chunks.
    order.clear();
    for (auto& s : seqs)
      if (s.admitted && !s.done && s.computed >= s.prompt_len) order.push_back(&s);
    for (auto& s : seqs)
      if (s.admitted && !s.done && s.computed < s.prompt_len) order.push_back(&s);
    if (order.empty()) break;

    std::int32_t budget = model_.max_batch_tokens(), rows_left = model_.max_logit_rows();
    std::int32_t prompt_tokens = 0;
    std::vector<Sequence*> in_batch;
    for (Sequence* s : order) {
      s->step_tokens = 0;
      s->step_logits = false;
      std::int32_t n = std::min(s->pending(), budget);
      bool logits = n == s->pending();
      if (logits && rows_left == 0) {
        n = std::min(n, s->pending() - 1);  // run the prompt but leave its last token
        logits = false;
      }
      if (n <= 0) continue;
      s->step_tokens = n;
      s->step_logits = logits;
      budget -= n;
      rows_left -= logits ? 1 : 0;
      if (s->computed < s->prompt_len) prompt_tokens += std::min(n, s->prompt_len - s->computed);
      in_batch.push_back(s);
      if (budget == 0) break;
    }
    // Packed in sequence order so logit rows come out ascending, one per sampling row.
    std::sort(in_batch.begin(), in_batch.end(),
              [](const Sequence* a, const Sequence* b) { return a->index < b->index; });

    batch.token_ids.clear();
    batch.positions.clear();
    batch.slot_mapping.clear();
    batch.query_start.assign(1, 0);
    batch.context_lens.clear();
    batch.block_tables.clear();
    batch.logit_rows.clear();
    batch.max_blocks_per_seq = 0;
    for (Sequence* s : in_batch)
      batch.max_blocks_per_seq = std::max(batch.max_blocks_per_seq,
                                          static_cast<std::int32_t>(s->table.blocks().size()));
    for (Sequence* s : in_batch) {
      for (std::int32_t j = 0; j < s->step_tokens; ++j) {
        const std::int32_t pos = s->computed + j;
        batch.token_ids.push_back(s->tokens[static_cast<std::size_t>(pos)]);
        batch.positions.push_back(pos);
        batch.slot_mapping.push_back(s->table.slot(pos));
      }
      batch.query_start.push_back(static_cast<std::int32_t>(batch.token_ids.size()));
      batch.context_lens.push_back(s->computed + s->step_tokens);
      const auto& blocks = s->table.blocks();
      batch.block_tables.insert(batch.block_tables.end(), blocks.begin(), blocks.end());
      batch.block_tables.resize(batch.context_lens.size() *
                                    static_cast<std::size_t>(batch.max_blocks_per_seq),
                                0);
      if (s->step_logits) batch.logit_rows.push_back(batch.query_start.back() - 1);
    }

    // Sampling inputs of the rows that get logits; histories only when a penalty needs them.
    sampling.rows.clear();
    sampling.prompt_tokens.clear();
    sampling.prompt_start.clear();
    sampling.output_tokens.clear();
    sampling.output_start.clear();
    bool penalties = false;
    for (Sequence* s : in_batch)
      if (s->step_logits && s->params->uses_penalties()) penalties = true;
    if (penalties) {
      sampling.prompt_start.push_back(0);
      sampling.output_start.push_back(0);
    }
    for (Sequence* s : in_batch) {
      if (!s->step_logits) continue;
      sampling.rows.push_back(
          s->params->row(s->seed, static_cast<std::uint64_t>(s->generated())));
      if (!penalties) continue;
      if (s->params->uses_penalties()) {
        const auto p = s->tokens.begin() + s->prompt_len;
        sampling.prompt_tokens.insert(sampling.prompt_tokens.end(), s->tokens.begin(), p);
        sampling.output_tokens.insert(sampling.output_tokens.end(), p, s->tokens.end());
      }
      sampling.prompt_start.push_back(static_cast<std::int32_t>(sampling.prompt_tokens.size()));
      sampling.output_start.push_back(static_cast<std::int32_t>(sampling.output_tokens.size()));
    }

    const std::int32_t real_tokens = batch.num_tokens();
    const bool decode_only = prompt_tokens == 0 && batch.num_tokens() == batch.num_seqs();
    if (decode_only && padding_block >= 0) {
      // Padding rows: token 0 at position 0 in the padding block, attending to itself alone,
      // with a logits row (so the recorded shape is the padded one) that nothing samples.
      const std::int32_t padded = std::min({padded_decode_size(batch.num_seqs()),
                                            model_.max_batch_tokens(), model_.max_logit_rows()});
      batch.max_blocks_per_seq = std::max(batch.max_blocks_per_seq, 1);
      const auto stride = static_cast<std::size_t>(batch.max_blocks_per_seq);
      for (std::int32_t i = batch.num_seqs(); i < padded; ++i) {
        batch.token_ids.push_back(0);
        batch.positions.push_back(0);
        batch.slot_mapping.push_back(padding_block * cache_->block_size());
        batch.query_start.push_back(static_cast<std::int32_t>(batch.token_ids.size()));
        batch.context_lens.push_back(1);
        batch.block_tables.push_back(padding_block);
        batch.block_tables.resize(batch.context_lens.size() * stride, 0);
        batch.logit_rows.push_back(batch.query_start.back() - 1);
      }
    }

    const auto t0 = Clock::now();
    const DeviceBatch device_batch = backend.upload_batch(batch);
    Tensor logits;
    if (decode_only) {
      // Same launch shapes every step at this (padded) size: the backend may record and replay.
      backend.run_graph((cache_epoch_ << 32) | static_cast<std::uint64_t>(batch.num_seqs()),
                        [&] { logits = model_.forward(device_batch, *cache_); });
      Tensor& kept = decode_logits_[batch.logit_rows.size()];
      if (logits.empty()) logits = kept;
      else kept = logits;
      logits = logits.rows(0, static_cast<std::int64_t>(sampling.rows.size()));  // the real rows
    } else {
      logits = model_.forward(device_batch, *cache_);
    }
    sampled.assign(sampling.rows.size(), 0);
    if (!sampling.rows.empty()) backend.sample(logits, sampling, sampled.data());
    else backend.synchronize();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    ++stats_.steps;
    if (prompt_tokens > 0) {
      stats_.prefill_tokens += prompt_tokens;
      stats_.prefill_seconds += dt;
    } else {
      stats_.decode_tokens += real_tokens;
      stats_.decode_seconds += dt;
    }

    std::size_t row = 0;
    for (Sequence* s : in_batch) {
      s->computed += s->step_tokens;
      if (!s->step_logits) continue;
      const std::int32_t id = sampled[row++];
      XSERV_CHECK(id >= 0 && id < cfg.vocab_size, ErrorCode::internal,
                  "generate: the backend sampled token {} outside the vocab of {}", id,
                  cfg.vocab_size);
      s->tokens.push_back(id);
      s->result->tokens.push_back(id);

      const SamplingParams& p = *s->params;
      FinishReason finish = FinishReason::none;
      bool stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) !=
                     p.stop_token_ids.end();
      if (!p.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end())
        stop_id = true;
      // Appends decoded bytes and cuts the text at a stop string; true when one matched.
      auto add_text = [&](const std::string& piece) {
        if (piece.empty() || p.stop_strings.empty()) {
          s->text += piece;
          return false;
        }
        const std::size_t from = s->text.size();
        s->text += piece;
        const std::size_t at = find_stop(s->text, from, p.stop_strings);
        if (at == std::string::npos) return false;
        s->text.resize(at);
        return true;
      };
      if (stop_id) {
        finish = FinishReason::stop;
      } else if (s->decoder && add_text(s->decoder->push(id))) {
        finish = FinishReason::stop;
      } else if (s->generated() >= p.max_tokens || static_cast<std::int32_t>(s->tokens.size()) >= s->limit) {
        finish = FinishReason::length;
      }
      // A finished sequence releases everything it held back (an unfinished UTF-8 tail, a
      // partial stop string) unless a stop string cut it.
      std::size_t release_end = s->text.size();
      if (finish == FinishReason::none) {
        release_end -= held_suffix(s->text, s->emitted, p.stop_strings);
      } else if (s->decoder && (finish == FinishReason::length || stop_id)) {
        if (add_text(s->decoder->flush())) finish = FinishReason::stop;
        release_end = s->text.size();
      }
      release_end = std::max(release_end, s->emitted);
      const std::string_view piece(s->text.data() + s->emitted, release_end - s->emitted);
      s->emitted = release_end;
      if (finish != FinishReason::none) {
        s->done = true;
        s->result->finish = finish;
      }
      if (on_token && !on_token(TokenEvent{s->index, id, piece, finish}) && !s->done) {
        s->done = true;
        s->result->finish = FinishReason::cancelled;
      }
      if (s->done) s->table.release(cache_->blocks());
    }
  }

  for (auto& s : seqs) {
    XSERV_CHECK(s.done, ErrorCode::internal, "generate: sequence {} never ran", s.index);
    s.result->text = s.text.substr(0, s.emitted);
  }
  return results;
}

}  // namespace xserv
