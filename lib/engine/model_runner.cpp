#include "engine/model_runner.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "core/error.hpp"
#include "engine/sampling_params.hpp"
#include "kv/block_pool.hpp"

namespace xserv {

namespace {
std::uint64_t next_epoch() noexcept {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

std::int32_t ModelRunner::padded_decode_size(std::int32_t n) noexcept {
  if (n <= 2) return n;
  if (n <= 4) return 4;
  return (n + 7) / 8 * 8;
}

ModelRunner::ModelRunner(Model& model, kv::KvCache& cache, std::optional<bool> pad_decode_batches)
    : model_(model),
      cache_(cache),
      pad_(pad_decode_batches.value_or(model.backend().records_graphs())),
      epoch_(next_epoch()) {}

ModelRunner::ModelRunner(ModelGroup& group, std::vector<kv::KvCache*> caches,
                         std::optional<bool> pad_decode_batches)
    : ModelRunner(group.leader(), *caches.at(0), pad_decode_batches) {
  XSERV_CHECK(static_cast<int>(caches.size()) == group.size(), ErrorCode::internal,
              "model runner: {} caches for {} ranks", caches.size(), group.size());
  if (group.size() > 1) {
    group_ = &group;
    caches_ = std::move(caches);
  }
}

void ModelRunner::build_batch(const SchedulerOutput& out) {
  ForwardBatch& b = batch_;
  b.token_ids.clear();
  b.positions.clear();
  b.slot_mapping.clear();
  b.query_start.assign(1, 0);
  b.context_lens.clear();
  b.block_tables.clear();
  b.logit_rows.clear();
  b.max_blocks_per_seq = 0;
  for (const auto& c : out.chunks)
    b.max_blocks_per_seq =
        std::max(b.max_blocks_per_seq, static_cast<std::int32_t>(c.seq->blocks.size()));
  const std::int32_t bs = cache_.block_size();
  batch_placeholders_ = false;
  for (const auto& c : out.chunks) {
    const Sequence& s = *c.seq;
    for (std::int32_t pos = c.start; pos < c.start + c.num_tokens; ++pos) {
      const std::int32_t token = s.tokens[static_cast<std::size_t>(pos)];
      if (token < 0) {
        // A placeholder: the last launch's sampled row -token - 1 (launch() resolves it).
        XSERV_CHECK(!pending_.empty() && static_cast<std::size_t>(-std::int64_t{token} - 1) < last_rows_,
                    ErrorCode::internal, "engine: placeholder token {} without its launched step",
                    token);
        batch_placeholders_ = true;
      }
      b.token_ids.push_back(token);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(s.blocks[static_cast<std::size_t>(pos / bs)] * bs + pos % bs);
    }
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(c.start + c.num_tokens);
    b.block_tables.insert(b.block_tables.end(), s.blocks.begin(), s.blocks.end());
    b.block_tables.resize(b.context_lens.size() * static_cast<std::size_t>(b.max_blocks_per_seq),
                          kv::BlockPool::null_block);
    if (c.sample) b.logit_rows.push_back(b.query_start.back() - 1);
  }
}

void ModelRunner::pad_batch() {
  ForwardBatch& b = batch_;
  const std::int32_t padded = std::min(
      {padded_decode_size(b.num_seqs()), model_.max_batch_tokens(), model_.max_logit_rows()});
  b.max_blocks_per_seq = std::max(b.max_blocks_per_seq, 1);
  const auto stride = static_cast<std::size_t>(b.max_blocks_per_seq);
  for (std::int32_t i = b.num_seqs(); i < padded; ++i) {
    b.token_ids.push_back(0);
    b.positions.push_back(0);
    b.slot_mapping.push_back(kv::BlockPool::null_block * cache_.block_size());
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(1);
    b.block_tables.push_back(kv::BlockPool::null_block);
    b.block_tables.resize(b.context_lens.size() * stride, kv::BlockPool::null_block);
    b.logit_rows.push_back(b.query_start.back() - 1);
  }
}

void ModelRunner::build_sampling(const SchedulerOutput& out) {
  SamplingBatch& sp = sampling_;
  sp.rows.clear();
  sp.prompt_tokens.clear();
  sp.prompt_start.clear();
  sp.output_tokens.clear();
  sp.output_start.clear();
  bool penalties = false;
  for (const auto& c : out.chunks)
    if (c.sample && c.seq->params->uses_penalties()) penalties = true;
  if (penalties) {
    sp.prompt_start.push_back(0);
    sp.output_start.push_back(0);
  }
  for (const auto& c : out.chunks) {
    if (!c.sample) continue;
    const Sequence& s = *c.seq;
    // Keyed by (seed, number of generated tokens): a recomputed (preempted) sequence draws the
    // same numbers again.
    sp.rows.push_back(s.params->row(s.seed, static_cast<std::uint64_t>(s.generated())));
    if (!penalties) continue;
    if (s.params->uses_penalties()) {
      const auto p = s.tokens.begin() + s.prompt_len;
      sp.prompt_tokens.insert(sp.prompt_tokens.end(), s.tokens.begin(), p);
      sp.output_tokens.insert(sp.output_tokens.end(), p, s.tokens.end());
    }
    sp.prompt_start.push_back(static_cast<std::int32_t>(sp.prompt_tokens.size()));
    sp.output_start.push_back(static_cast<std::int32_t>(sp.output_tokens.size()));
  }
}

void ModelRunner::compute_logprobs(const Tensor& raw, const SchedulerOutput& out,
                                   std::vector<SampledToken>& result) {
  std::int32_t top_n = 0;
  for (const auto& c : out.chunks)
    if (c.sample) top_n = std::max(top_n, c.seq->logprobs);
  const auto rows = static_cast<std::size_t>(raw.shape[0]);
  std::vector<float> chosen(rows);
  std::vector<std::int32_t> top_ids(rows * static_cast<std::size_t>(top_n));
  std::vector<float> top_lp(top_ids.size());
  model_.backend().logprobs(raw, ids_.data(), top_n, chosen.data(), top_ids.data(), top_lp.data());
  std::size_t row = 0;
  for (const auto& c : out.chunks) {
    if (!c.sample) continue;
    SampledToken& t = result[row];
    if (c.seq->logprobs > 0) {
      t.logprob = chosen[row];
      for (std::int32_t k = 0; k < c.seq->logprobs; ++k) {
        const std::size_t at = row * static_cast<std::size_t>(top_n) + static_cast<std::size_t>(k);
        t.top.push_back({top_ids[at], top_lp[at]});
      }
    }
    ++row;
  }
}

Tensor ModelRunner::forward_rank(Model& model, kv::KvCache& cache, bool decode_only, bool leader) {
  Backend& backend = model.backend();
  // With launches on, a decode step's batch may stay on the device from the step before
  // (Backend::upload_decode_batch: the steady state of overlapped steps uploads nothing).
  const bool kept_batch = decode_only && launches_ && backend.keeps_decode_batches();
  const DeviceBatch device_batch =
      kept_batch ? backend.upload_decode_batch(batch_, growing_seqs_) : backend.upload_batch(batch_);
  // Placeholder ids (an overlapped step's inputs) come from the last launch's ids on the device.
  const Tensor sampled(sampled_ids_.data(), DType::i32,
                       {static_cast<std::int64_t>(sampled_ids_.size() / 4)}, backend.device());
  if (!decode_only) {
    if (batch_placeholders_) backend.resolve_tokens(device_batch.token_ids, sampled);
    return model.forward(device_batch, cache);
  }
  XSERV_CHECK(launches_ || !batch_placeholders_, ErrorCode::internal,
              "engine: placeholder tokens while launches are off");
  // Same launch shapes every step at this (padded) size: the backend may record and replay
  // (per rank; a recording holds that rank's collectives too). With launches on, every decode
  // recording starts with the placeholders' resolve (token_ids and the ids buffer keep their
  // addresses): a no-op in a step without placeholders, and no kernel launch of its own before
  // the graph in one with them. A kept batch's prepare_decode is that resolve and the advance.
  const auto size = batch_.num_seqs();
  Tensor logits;
  backend.run_graph((epoch_ << 32) | static_cast<std::uint64_t>(size), [&] {
    if (kept_batch) backend.prepare_decode(device_batch, sampled);
    else if (launches_) backend.resolve_tokens(device_batch.token_ids, sampled);
    logits = model.forward(device_batch, cache);
  });
  if (!leader) return logits;
  Tensor& kept = decode_logits_[size];
  if (logits.empty()) logits = kept;
  else kept = logits;
  return logits;
}

Tensor ModelRunner::prepare_and_forward(const SchedulerOutput& out) {
  const auto t0 = std::chrono::steady_clock::now();
  build_batch(out);
  build_sampling(out);
  const std::size_t rows = sampling_.rows.size();
  const bool decode_only = out.decode_only();
  growing_seqs_ = batch_.num_seqs();  // the padding after them never grows
  if (decode_only && pad_) pad_batch();
  last_host_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Tensor logits;
  if (group_ == nullptr) {
    logits = forward_rank(model_, cache_, decode_only, true);
  } else {
    group_->run([&](int r) {
      Tensor l = forward_rank(group_->model(r), *caches_[static_cast<std::size_t>(r)],
                              decode_only, r == 0);
      if (r == 0) logits = l;
    });
  }
  if (rows == 0) return {};
  return logits.rows(0, static_cast<std::int64_t>(rows));  // the real rows, padding left out
}

bool ModelRunner::supports_launch() const noexcept {
  return group_ == nullptr && model_.backend().samples_async();
}

void ModelRunner::enable_launch() {
  XSERV_CHECK(supports_launch(), ErrorCode::internal, "engine: this runner cannot launch steps");
  if (launches_) return;
  Backend& backend = model_.backend();
  sampled_ids_ = Buffer(backend.allocator(), static_cast<std::size_t>(model_.max_logit_rows()) * 4);
  launches_ = true;
}

bool ModelRunner::can_launch(const SchedulerOutput& out) const {
  // Pure decode steps without penalties (they read the output tokens on the host) or logprobs
  // (computed from the ids on the host); anything else runs through execute().
  if (!launches_ || !out.decode_only()) return false;
  for (const auto& c : out.chunks)
    if (c.seq->logprobs > 0 || c.seq->params->uses_penalties()) return false;
  return true;
}

void ModelRunner::launch(const SchedulerOutput& out) {
  XSERV_CHECK(can_launch(out) && pending_.size() < 2, ErrorCode::internal,
              "engine: a step launched that cannot overlap ({} in flight)", pending_.size());
  Backend& backend = model_.backend();
  std::lock_guard lock(model_.forward_mutex());  // the workspace's logits, until sampled
  const Tensor logits = prepare_and_forward(out);
  const auto rows = static_cast<std::size_t>(logits.shape[0]);
  const Tensor ids(sampled_ids_.data(), DType::i32, {static_cast<std::int64_t>(rows)},
                   backend.device());
  pending_.push_back({backend.sample_async(logits, sampling_, ids), rows});
  last_rows_ = rows;
}

std::vector<SampledToken> ModelRunner::collect() {
  XSERV_CHECK(!pending_.empty(), ErrorCode::internal, "engine: nothing launched to collect");
  const Pending p = pending_.front();
  pending_.erase(pending_.begin());
  ids_.assign(p.rows, 0);
  model_.backend().wait_sampled(p.ticket, ids_.data());
  std::vector<SampledToken> result(p.rows);
  const std::int32_t vocab = model_.config().vocab_size;
  for (std::size_t r = 0; r < p.rows; ++r) {
    XSERV_CHECK(ids_[r] >= 0 && ids_[r] < vocab, ErrorCode::internal,
                "engine: the backend sampled token {} outside the vocab of {}", ids_[r], vocab);
    result[r].token = ids_[r];
  }
  return result;
}

std::vector<SampledToken> ModelRunner::execute(const SchedulerOutput& out) {
  Backend& backend = model_.backend();
  XSERV_CHECK(pending_.empty(), ErrorCode::internal,
              "engine: a synchronous step while {} launched steps are not collected", pending_.size());
  std::lock_guard lock(model_.forward_mutex());  // the model's workspace holds the logits
  Tensor logits = prepare_and_forward(out);
  const std::size_t rows = sampling_.rows.size();
  std::vector<SampledToken> result(rows);
  if (rows == 0) {
    backend.synchronize();
    return result;
  }

  bool want_logprobs = false;
  for (const auto& c : out.chunks)
    if (c.sample && c.seq->logprobs > 0) want_logprobs = true;
  Tensor raw;
  if (want_logprobs) {
    // sample() changes the logits in place (penalties, temperature); logprobs are of the raw ones.
    if (raw_logits_.size() < logits.bytes()) raw_logits_ = Buffer(backend.allocator(), logits.bytes());
    raw = Tensor(raw_logits_.data(), logits.dtype, logits.shape, backend.device());
    backend.copy(raw, logits);
  }
  ids_.assign(rows, 0);
  backend.sample(logits, sampling_, ids_.data());
  const std::int32_t vocab = model_.config().vocab_size;
  for (std::size_t r = 0; r < rows; ++r) {
    XSERV_CHECK(ids_[r] >= 0 && ids_[r] < vocab, ErrorCode::internal,
                "engine: the backend sampled token {} outside the vocab of {}", ids_[r], vocab);
    result[r].token = ids_[r];
  }
  if (want_logprobs) compute_logprobs(raw, out, result);
  return result;
}

}  // namespace xserv
