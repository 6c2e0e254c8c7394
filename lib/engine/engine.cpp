#include "engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <random>
#include <string_view>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv {

std::string_view finish_reason_name(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "unknown";
}

// A submitted request: its samples and their output processors. Owned by the step thread once
// taken from the inbox; never moves (sequences and processors point into it).
struct Engine::Request {
  RequestId id = 0;
  EngineRequest req;
  std::uint64_t base_seed = 0;
  std::deque<Sequence> seqs;  // one per sample; a deque so that addresses stay put
  std::vector<OutputProcessor> outputs;
  std::int32_t live = 0;  // samples that have not ended
};

namespace {

constexpr std::int32_t max_samples = 128;

// Blocks of the KV pool, the null block included (see EngineOptions). With tensor parallelism
// every rank's cache has as many blocks, so the rank with the least free memory decides.
std::int32_t pool_blocks(const Model& model, const EngineOptions& o, const ModelGroup* group) {
  const std::size_t per_block = model.kv_spec().bytes_per_block(o.block_size);
  std::int64_t blocks = 0;
  if (o.kv_cache_tokens > 0) {
    blocks = (o.kv_cache_tokens + o.block_size - 1) / o.block_size;
  } else {
    MemoryInfo mem = model.backend().memory_info();
    for (int r = 1; group != nullptr && r < group->size(); ++r)
      mem.free_bytes = std::min(mem.free_bytes, group->backend(r).memory_info().free_bytes);
    // Asking another rank's GPU made it current (CUDA): this thread works for rank 0.
    if (group != nullptr) model.backend().bind_thread();
    std::size_t bytes = 0;
    if (model.backend().device().kind == DeviceKind::cuda) {
      bytes = static_cast<std::size_t>(static_cast<double>(mem.free_bytes) * o.gpu_memory_fraction);
    } else if (o.kv_cache_bytes > 0) {
      bytes = o.kv_cache_bytes;
    } else {
      const std::size_t contexts =
          static_cast<std::size_t>(o.max_seqs) *
          static_cast<std::size_t>(model.config().max_position_embeddings + o.block_size) /
          static_cast<std::size_t>(o.block_size) * per_block;
      bytes = mem.total_bytes > 0 ? std::min(contexts, mem.total_bytes / 4) : contexts;
    }
    blocks = static_cast<std::int64_t>(bytes / per_block);
  }
  XSERV_CHECK(blocks >= 1, ErrorCode::out_of_memory,
              "engine: the KV budget holds no block of {} bytes ({} tokens)", per_block,
              o.block_size);
  XSERV_CHECK(blocks < std::numeric_limits<std::int32_t>::max(), ErrorCode::invalid_argument,
              "engine: a KV pool of {} blocks is too large", blocks);
  return static_cast<std::int32_t>(blocks + 1);
}

void validate(const EngineOptions& o) {
  XSERV_CHECK(o.max_seqs > 0, ErrorCode::invalid_argument, "engine: max_seqs = {} (expected > 0)",
              o.max_seqs);
  XSERV_CHECK(o.max_batch_tokens >= 0, ErrorCode::invalid_argument,
              "engine: max_batch_tokens = {} (expected >= 0)", o.max_batch_tokens);
  XSERV_CHECK(o.max_prefill_tokens >= 0, ErrorCode::invalid_argument,
              "engine: max_prefill_tokens = {} (expected >= 0)", o.max_prefill_tokens);
  XSERV_CHECK(o.kv_cache_tokens >= 0, ErrorCode::invalid_argument,
              "engine: kv_cache_tokens = {} (expected >= 0)", o.kv_cache_tokens);
  XSERV_CHECK(std::isfinite(o.gpu_memory_fraction) && o.gpu_memory_fraction > 0.0f &&
                  o.gpu_memory_fraction <= 1.0f,
              ErrorCode::invalid_argument,
              "engine: gpu_memory_fraction = {} (expected 0 < f <= 1)", o.gpu_memory_fraction);
  XSERV_CHECK(o.block_size > 0 && o.block_size <= 1024, ErrorCode::invalid_argument,
              "engine: block_size = {} (expected 1 ..= 1024)", o.block_size);
  XSERV_CHECK(o.max_waiting >= 0, ErrorCode::invalid_argument,
              "engine: max_waiting = {} (expected >= 0)", o.max_waiting);
}

}  // namespace

Engine::Engine(Model& model, const Tokenizer* tokenizer, const EngineOptions& options)
    : Engine(model, nullptr, tokenizer, options) {}

Engine::Engine(ModelGroup& group, const Tokenizer* tokenizer, const EngineOptions& options)
    : Engine(group.leader(), &group, tokenizer, options) {}

Engine::Engine(Model& model, ModelGroup* group, const Tokenizer* tokenizer,
               const EngineOptions& options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  validate(options_);
  // Ids the tokenizer makes must be rows of the embedding (a mismatched tokenizer.json would
  // send them past the gather). The C API checks this at load; every other host meets it here.
  if (tokenizer_ != nullptr) model.check_tokenizer(tokenizer_->vocab_size(), "the engine's tokenizer");
  eos_ids_ = load_eos_token_ids(model.dir(), model.config());
  // A step samples one row per running sequence: the batch is capped at the model's logits rows.
  options_.max_seqs = std::min(options_.max_seqs, model.max_logit_rows());
  if (options_.max_batch_tokens == 0 || options_.max_batch_tokens > model.max_batch_tokens())
    options_.max_batch_tokens = model.max_batch_tokens();
  const std::int32_t blocks = pool_blocks(model, options_, group);
  const kv::KvCacheOptions cache_options{options_.block_size, blocks, 0, options_.prefix_cache};
  cache_ = std::make_unique<kv::KvCache>(model.backend(), model.kv_spec(), cache_options);
  scheduler_ = std::make_unique<Scheduler>(
      cache_->blocks(), SchedulerConfig{options_.max_seqs, options_.max_batch_tokens,
                                        options_.max_prefill_tokens});
  if (group != nullptr && group->size() > 1) {
    // Each rank's cache made on its own thread (its device current).
    rank_caches_.resize(static_cast<std::size_t>(group->size() - 1));
    group->run([&](int r) {
      if (r == 0) return;
      Model& m = group->model(r);
      rank_caches_[static_cast<std::size_t>(r - 1)] =
          std::make_unique<kv::KvCache>(m.backend(), m.kv_spec(), cache_options);
    });
    std::vector<kv::KvCache*> caches{cache_.get()};
    for (auto& c : rank_caches_) caches.push_back(c.get());
    runner_ = std::make_unique<ModelRunner>(*group, std::move(caches), options_.pad_decode_batches);
  } else {
    runner_ = std::make_unique<ModelRunner>(model, *cache_, options_.pad_decode_batches);
  }
  bool async = model.backend().device().kind == DeviceKind::cuda;
  if (const char* env = std::getenv("XSERV_ASYNC_STEPS")) async = std::string_view(env) != "0";
  async_ = options_.async_steps.value_or(async) && runner_->supports_launch();
  if (async_) runner_->enable_launch();
  publish_stats();
  if (options_.background_thread) thread_ = std::thread([this] { background_loop(); });
}

Engine::~Engine() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(inbox_mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  // A launched step still in flight (every sample ended meanwhile, or a failed step's): its ids
  // are read and dropped so that the backend frees what it staged for them.
  while (runner_->launched() > 0) {
    try {
      runner_->collect();
    } catch (...) {
    }
  }
}

std::int32_t Engine::kv_cache_tokens() const noexcept {
  return (cache_->num_blocks() - 1) * cache_->block_size();
}

RequestId Engine::submit(EngineRequest request) {
  const ModelConfig& cfg = model_.config();
  const auto n = static_cast<std::int64_t>(request.prompt.size());
  XSERV_CHECK(n > 0, ErrorCode::invalid_argument, "submit: the prompt is empty");
  XSERV_CHECK(n <= cfg.max_position_embeddings, ErrorCode::invalid_argument,
              "submit: the prompt has {} tokens, more than the model's context of {} "
              "(max_position_embeddings)",
              n, cfg.max_position_embeddings);
  for (auto id : request.prompt)
    XSERV_CHECK(id >= 0 && id < cfg.vocab_size, ErrorCode::invalid_argument,
                "submit: prompt token {} is outside the vocabulary of {}", id, cfg.vocab_size);
  request.params.validate();
  XSERV_CHECK(request.n >= 1 && request.n <= max_samples, ErrorCode::invalid_argument,
              "submit: n = {} (expected 1 ..= {})", request.n, max_samples);
  XSERV_CHECK(request.logprobs >= 0 && request.logprobs <= max_top_logprobs,
              ErrorCode::invalid_argument, "submit: logprobs = {} (expected 0 ..= {})",
              request.logprobs, max_top_logprobs);
  XSERV_CHECK(request.params.stop_strings.empty() || tokenizer_, ErrorCode::invalid_argument,
              "submit: stop strings need a tokenizer");

  auto r = std::make_unique<Request>();
  r->req = std::move(request);
  r->base_seed = r->req.params.seed ? *r->req.params.seed
                                    : (std::uint64_t{std::random_device{}()} << 32) ^
                                          std::uint64_t{std::random_device{}()};
  RequestId id = 0;
  {
    std::lock_guard lock(inbox_mutex_);
    if (options_.max_waiting > 0) {
      std::int64_t waiting = static_cast<std::int64_t>(inbox_.size());
      {
        std::lock_guard s(stats_mutex_);
        waiting += stats_.waiting;
      }
      XSERV_CHECK(waiting < options_.max_waiting, ErrorCode::resource_exhausted,
                  "submit: {} requests are already waiting (max_waiting)", waiting);
    }
    id = next_id_.fetch_add(1);
    r->id = id;
    inbox_.push_back(std::move(r));
    live_requests_.fetch_add(1);
  }
  wake_.notify_one();
  return id;
}

void Engine::cancel(RequestId id) {
  {
    std::lock_guard lock(inbox_mutex_);
    cancels_.push_back(id);
  }
  wake_.notify_one();
}

bool Engine::has_work() const noexcept { return live_requests_.load() > 0; }

bool Engine::poll(EngineEvent& out) {
  std::lock_guard lock(events_mutex_);
  if (queued_events_.empty()) return false;
  out = std::move(queued_events_.front());
  queued_events_.pop_front();
  return true;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void Engine::publish_stats() {
  EngineStats s;
  s.running = scheduler_->num_running();
  s.waiting = scheduler_->num_waiting();
  const kv::BlockPool& pool = cache_->blocks();
  s.kv_blocks_total = pool.num_blocks() - 1;
  s.kv_blocks_used = pool.num_used();
  s.block_size = pool.block_size();
  s.prefix_queries = pool.queries();
  s.prefix_hits = pool.hits();
  s.preemptions = scheduler_->preemptions();
  s.steps = steps_;
  s.prompt_tokens = prompt_tokens_;
  s.generated_tokens = generated_tokens_;
  s.host_seconds = host_seconds_;
  s.forward_seconds = forward_seconds_;
  s.decode_steps = decode_steps_;
  s.decode_forward_seconds = decode_forward_seconds_;
  s.overlapped_steps = overlapped_steps_;
  std::lock_guard lock(stats_mutex_);
  stats_ = s;
}

void Engine::admit_request(std::unique_ptr<Request> owned, std::vector<EngineEvent>& events,
                           std::vector<EventCallback*>& sinks) {
  Request& r = *owned;
  requests_.emplace(r.id, std::move(owned));
  const auto prompt_len = static_cast<std::int32_t>(r.req.prompt.size());
  const std::int32_t max_len = static_cast<std::int32_t>(std::min<std::int64_t>(
      std::int64_t{prompt_len} + r.req.params.max_tokens, model_.config().max_position_embeddings));
  const std::uint64_t arrival = arrivals_++;
  r.outputs.reserve(static_cast<std::size_t>(r.req.n));
  for (std::int32_t i = 0; i < r.req.n; ++i) {
    Sequence& s = r.seqs.emplace_back();
    s.request = r.id;
    s.index = i;
    s.arrival = arrival;
    s.tokens = r.req.prompt;
    s.prompt_len = prompt_len;
    s.max_len = max_len;
    s.params = &r.req.params;
    s.seed = r.base_seed + static_cast<std::uint64_t>(i);
    s.logprobs = r.req.logprobs;
    if (i > 0) s.leader = &r.seqs.front();
    r.outputs.emplace_back(tokenizer_, r.req.params, eos_ids_);
    ++r.live;
  }
  for (Sequence& s : r.seqs) {
    if (max_len <= prompt_len) {  // nothing to generate: max_tokens 0 or a full context
      EngineEvent e;
      e.type = EventType::finished;
      e.finish = FinishReason::length;
      end_sample(r, s, std::move(e), events, sinks);
    } else {
      scheduler_->add(&s);
    }
  }
}

void Engine::end_sample(Request& r, Sequence& s, EngineEvent e, std::vector<EngineEvent>& events,
                        std::vector<EventCallback*>& sinks) {
  if (s.status != SeqStatus::finished) scheduler_->remove(&s);
  s.status = SeqStatus::finished;
  e.request = r.id;
  e.index = s.index;
  e.prompt_tokens = s.prompt_len;
  e.cached_tokens = s.cached_tokens;
  e.completion_tokens = std::max(0, s.generated());
  events.push_back(std::move(e));
  sinks.push_back(r.req.on_event ? &r.req.on_event : nullptr);
  if (--r.live == 0) {
    // Kept alive until its events (and callback) are delivered at the end of the step.
    auto it = requests_.find(r.id);
    retired_.push_back(std::move(it->second));
    requests_.erase(it);
  }
}

Engine::Inbox Engine::grab_inbox() {
  Inbox inbox;
  std::lock_guard lock(inbox_mutex_);
  inbox.incoming.swap(inbox_);
  inbox.cancels.swap(cancels_);
  return inbox;
}

void Engine::apply_inbox(Inbox& inbox, std::vector<EngineEvent>& events,
                         std::vector<EventCallback*>& sinks) {
  for (auto& r : inbox.incoming) admit_request(std::move(r), events, sinks);
  for (RequestId id : inbox.cancels) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // unknown or already ended
    Request& r = *it->second;
    for (Sequence& s : r.seqs) {
      if (s.status == SeqStatus::finished) continue;
      EngineEvent e;
      e.type = EventType::finished;
      e.finish = FinishReason::cancelled;
      end_sample(r, s, std::move(e), events, sinks);  // may retire r: touch nothing after
      if (requests_.find(id) == requests_.end()) break;
    }
  }
}

void Engine::fail_running(ErrorCode code, const std::string& message,
                          std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks) {
  std::vector<Sequence*> victims;
  for (auto& [id, r] : requests_)
    for (Sequence& s : r->seqs)
      if (s.status == SeqStatus::running) victims.push_back(&s);
  for (Sequence* s : victims) {
    EngineEvent e;
    e.type = EventType::finished;
    e.finish = FinishReason::error;
    e.status = code;
    e.error = message;
    end_sample(*requests_.at(s->request), *s, std::move(e), events, sinks);
  }
}

std::size_t Engine::deliver(std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks) {
  std::exception_ptr error;
  std::vector<EngineEvent> queued;
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (sinks[i] == nullptr) {
      queued.push_back(std::move(events[i]));
      continue;
    }
    try {
      (*sinks[i])(events[i]);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (!queued.empty()) {
    std::lock_guard lock(events_mutex_);
    for (auto& e : queued) queued_events_.push_back(std::move(e));
  }
  // Requests end for has_work() only once their last event is out.
  live_requests_.fetch_sub(static_cast<std::int64_t>(retired_.size()));
  retired_.clear();
  publish_stats();
  if (error) std::rethrow_exception(error);
  return events.size();
}

std::size_t Engine::step() {
  XSERV_CHECK(!options_.background_thread, ErrorCode::invalid_argument,
              "step: the engine steps on its own thread (background_thread)");
  return step_locked();
}

void Engine::fail_step(ErrorCode code, const std::string& message, std::vector<EngineEvent>& events,
                       std::vector<EventCallback*>& sinks) {
  // Launched steps are dropped (their ids read if the backend still can) and their sequences'
  // placeholders with them: the sequences end here.
  while (runner_->launched() > 0) {
    try {
      runner_->collect();
    } catch (...) {
    }
  }
  in_flight_.clear();
  for (Sequence* s : scheduler_->running())
    while (!s->tokens.empty() && s->tokens.back() < 0) s->tokens.pop_back();
  fail_running(code, message, events, sinks);
  deliver(events, sinks);
}

template <typename F>
decltype(auto) Engine::guarded(F&& f, std::vector<EngineEvent>& events,
                               std::vector<EventCallback*>& sinks) {
  try {
    return f();
  } catch (const Error& e) {
    fail_step(e.code(), e.what(), events, sinks);
    throw;
  } catch (const std::bad_alloc&) {
    fail_step(ErrorCode::out_of_memory, "out of host memory", events, sinks);
    throw;
  } catch (const std::exception& e) {
    fail_step(ErrorCode::internal, e.what(), events, sinks);
    throw;
  }
}

void Engine::emit_tokens(const SchedulerOutput& out, std::vector<SampledToken>& sampled,
                         std::vector<EngineEvent>& events, std::vector<EventCallback*>& sinks) {
  std::size_t row = 0;
  for (const ScheduledChunk& c : out.chunks) {
    if (!c.sample) continue;
    SampledToken& t = sampled[row++];
    if (c.seq == nullptr) continue;  // ended while its step was in flight: the token is dropped
    Sequence& s = *c.seq;
    // A launched step left placeholders at the end of the tokens: this step's, and the next
    // step's when that one is in flight too. The output processor appends the real id in this
    // step's place; the next placeholder goes back unless the sample ends here (then the next
    // step's token for it is dropped: its chunk is cleared before the events go out).
    std::int32_t next_placeholder = 0;
    if (s.tokens.size() >= 2 && s.tokens.back() < 0 && s.tokens[s.tokens.size() - 2] < 0) {
      next_placeholder = s.tokens.back();
      s.tokens.pop_back();
    }
    if (!s.tokens.empty() && s.tokens.back() < 0) s.tokens.pop_back();
    Request& r = *requests_.at(s.request);
    const OutputProcessor::Step st = r.outputs[static_cast<std::size_t>(s.index)].append(s, t.token);
    ++generated_tokens_;
    EngineEvent e;
    e.type = EventType::token;
    e.token = t.token;
    e.text = st.text;
    e.logprob = t.logprob;
    e.top_logprobs = std::move(t.top);
    if (st.finish != FinishReason::none) {
      e.finish = st.finish;
      end_sample(r, s, std::move(e), events, sinks);
    } else {
      if (next_placeholder < 0) s.tokens.push_back(next_placeholder);
      e.request = r.id;
      e.index = s.index;
      events.push_back(std::move(e));
      sinks.push_back(r.req.on_event ? &r.req.on_event : nullptr);
    }
  }
}

bool Engine::can_overlap() const {
  // The steady decode state only: nothing waits, no preemption, no prompt chunk.
  if (!scheduler_->next_is_plain_decode()) return false;
  bool goes_on = false;
  for (const Sequence* s : scheduler_->running()) {
    // Penalties read the output tokens on the host, logprobs are computed from the host's ids.
    if (s->logprobs > 0 || s->params->uses_penalties()) return false;
    // A sample whose in-flight token is its last (max_tokens, the context) ends whatever that
    // token is; a step for those alone would compute tokens nobody reads.
    if (s->generated() < s->params->max_tokens && s->num_tokens() < s->max_len) goes_on = true;
  }
  return goes_on;
}

double Engine::launch(SchedulerOutput out, std::vector<EngineEvent>& events,
                      std::vector<EventCallback*>& sinks) {
  const auto t0 = std::chrono::steady_clock::now();
  guarded([&] { runner_->launch(out); }, events, sinks);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
      runner_->last_host_seconds();
  // Each sampling sequence's next token is row r of this step's ids, on the device only until
  // finish_in_flight() reads them.
  std::int32_t row = 0;
  for (const ScheduledChunk& c : out.chunks)
    if (c.sample) c.seq->tokens.push_back(-(++row));
  ++steps_;
  prompt_tokens_ += static_cast<std::uint64_t>(out.num_prompt_tokens);
  ++decode_steps_;  // only pure decode steps are launched
  in_flight_.push_back(std::move(out));
  return seconds;
}

double Engine::finish_in_flight(std::vector<EngineEvent>& events,
                                std::vector<EventCallback*>& sinks) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<SampledToken> sampled = guarded([&] { return runner_->collect(); }, events, sinks);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const SchedulerOutput out = std::move(in_flight_.front());
  in_flight_.pop_front();
  emit_tokens(out, sampled, events, sinks);
  return seconds;
}

std::size_t Engine::step_locked() {
  std::lock_guard step_lock(step_mutex_);  // a second stepping thread waits instead of racing
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::vector<EngineEvent> events;
  std::vector<EventCallback*> sinks;
  // Seconds in the runner (upload, forward, sampling, the wait for the ids), and those of pure
  // decode steps among them (every launched step is one).
  double forward = 0, decode_forward = 0;

  // Overlapped steps (docs/engine.md): with a step in flight, the next one is scheduled on top
  // of it only in the steady decode state; anything else (new requests or cancellations, a
  // prompt chunk, a preemption, penalties, logprobs) first waits for the step in flight and
  // then runs as a synchronous step would.
  Inbox inbox = grab_inbox();
  const bool overlap = !in_flight_.empty() && inbox.empty() && can_overlap();
  if (!in_flight_.empty() && !overlap) decode_forward += finish_in_flight(events, sinks);
  apply_inbox(inbox, events, sinks);

  SchedulerOutput out = scheduler_->schedule();
  for (Sequence* s : out.failed) {
    EngineEvent e;
    e.type = EventType::finished;
    e.finish = FinishReason::error;
    e.status = ErrorCode::resource_exhausted;
    e.error = s->error;
    end_sample(*requests_.at(s->request), *s, std::move(e), events, sinks);
  }
  if (!out.empty()) {
    if (overlap) {
      XSERV_CHECK(out.decode_only() && out.preempted.empty() && runner_->can_launch(out),
                  ErrorCode::internal, "engine: an overlapped step is not a plain decode");
      decode_forward += launch(std::move(out), events, sinks);
      ++overlapped_steps_;
      decode_forward += finish_in_flight(events, sinks);  // the older step
      // The new step's inputs are real tokens now (or their samples ended): its full blocks
      // may be hashed into the prefix cache.
      scheduler_->update(in_flight_.front());
    } else if (async_ && runner_->can_launch(out)) {
      // The first step of a decode run: launched, its ids are processed by the next step. Its
      // inputs are real tokens: its full blocks may be hashed now.
      decode_forward += launch(std::move(out), events, sinks);
      scheduler_->update(in_flight_.back());
    } else {
      const auto forward_start = Clock::now();
      std::vector<SampledToken> sampled =
          guarded([&] { return runner_->execute(out); }, events, sinks);
      const double seconds = std::chrono::duration<double>(Clock::now() - forward_start).count() -
                             runner_->last_host_seconds();
      scheduler_->update(out);
      ++steps_;
      prompt_tokens_ += static_cast<std::uint64_t>(out.num_prompt_tokens);
      if (out.num_prompt_tokens == 0) {
        ++decode_steps_;
        decode_forward += seconds;
      } else {
        forward += seconds;
      }
      emit_tokens(out, sampled, events, sinks);
    }
  }
  // Samples that ended in this step leave the step in flight before their requests retire.
  bool live = false;
  for (SchedulerOutput& o : in_flight_)
    for (ScheduledChunk& c : o.chunks) {
      if (c.seq != nullptr && c.seq->status == SeqStatus::finished) c.seq = nullptr;
      live = live || c.seq != nullptr;
    }
  // A step in flight for ended samples only: read and dropped now rather than left pending.
  if (!in_flight_.empty() && !live) decode_forward += finish_in_flight(events, sinks);
  forward += decode_forward;
  forward_seconds_ += forward;
  decode_forward_seconds_ += decode_forward;
  const std::size_t n = deliver(events, sinks);
  // The host share includes the delivery of this step's events (callbacks included).
  host_seconds_ += std::chrono::duration<double>(Clock::now() - start).count() - forward;
  publish_stats();
  return n;
}

void Engine::background_loop() {
  for (;;) {
    {
      std::unique_lock lock(inbox_mutex_);
      wake_.wait(lock, [&] { return stopping_ || live_requests_.load() > 0; });
      if (stopping_) return;
    }
    try {
      step_locked();
    } catch (...) {
      // The failing requests got error events; the engine goes on with the others.
    }
  }
}

}  // namespace xserv
