// xserv.hpp — the public C++ API of xserv: a header-only RAII layer over the C ABI (xserv.h).
//
// Why header-only over the C functions: libxserv exports nothing but the xserv_* C symbols, so
// this API adds no C++ symbols to the library and does not depend on the compiler or standard
// library the library was built with. Everything here is inline and compiled into the caller.
// It needs C++17.
//
//   #include <xserv/xserv.hpp>
//   auto model = xserv::Model::load("examples/models/shakespeare");
//   xserv::GenerateOptions opts;
//   opts.max_tokens = 64;
//   model.generate("ROMEO:", opts, [](const xserv::TokenEvent& e) {
//     std::cout << e.text << std::flush;
//     return true;  // false stops generation
//   });
//
// Continuous batching: xserv::Engine over a Model (submit from any thread, step() from one).
//
// Errors throw xserv::Error, which carries the xserv_status and the library's message.
// Thread-safety is the C API's: all calls on one Model are serialized inside the library.
//
// The types live in an inline namespace (xserv::v0) so their mangled names are versioned with
// the ABI and never collide with xserv's internal C++ types, which share the xserv namespace but
// stay hidden inside the library. Do not include this header in a translation unit that also
// includes xserv's internal headers.
#pragma once

#include <xserv.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xserv {
inline namespace v0 {

// A failed call: the status and the message of xserv_last_error().
class Error : public std::runtime_error {
 public:
  Error(xserv_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  xserv_status status() const noexcept { return status_; }
  const char* status_name() const noexcept { return xserv_status_string(status_); }

 private:
  xserv_status status_;
};

namespace detail {
inline void check(xserv_status status) {
  if (status != XSERV_OK) throw Error(status, xserv_last_error());
}
}  // namespace detail

inline std::string version() { return xserv_version(); }
// True when this build has the CUDA backend and a usable GPU is visible (what Device::automatic
// picks).
inline bool cuda_available() { return xserv_cuda_available(); }

enum class Device { automatic = XSERV_DEVICE_AUTO, cpu = XSERV_DEVICE_CPU, cuda = XSERV_DEVICE_CUDA };
enum class DType {
  automatic = XSERV_DTYPE_AUTO,
  f32 = XSERV_DTYPE_F32,
  f16 = XSERV_DTYPE_F16,
  bf16 = XSERV_DTYPE_BF16,
};
enum class FinishReason {
  none = XSERV_FINISH_NONE,
  stop = XSERV_FINISH_STOP,
  length = XSERV_FINISH_LENGTH,
  cancelled = XSERV_FINISH_CANCELLED,
  error = XSERV_FINISH_ERROR,  // engine events only: the request failed (Event::status says why)
};

// How a model is loaded (xserv_model_params).
struct ModelOptions {
  Device device = Device::automatic;
  int device_index = 0;
  int threads = 0;  // CPU worker threads; 0: all
  DType dtype = DType::automatic;
  int max_batch_tokens = 0;  // 0: the library's default
  // Ranks the model is split over (tensor parallelism, docs/parallel.md): CUDA GPUs
  // device_index .. device_index + tensor_parallel_size - 1, or threads on the CPU. 1: no split.
  int tensor_parallel_size = 1;
  // The K/V cache's dtype (xserv_model_params.kv_cache_dtype): automatic, the backend's; on the
  // CPU f32 or bf16 (half the cache's memory and bytes), on CUDA only the activation dtype.
  DType kv_cache_dtype = DType::automatic;
  // Called with the fraction loaded in [0, 1]; return false to cancel (load throws Error with
  // XSERV_ERR_CANCELLED). An exception it throws cancels the load and is rethrown by load().
  std::function<bool(float)> on_progress;
};

// How text is generated (xserv_generate_params); the defaults are the library's.
struct GenerateOptions {
  int max_tokens = 128;
  float temperature = 1.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<std::uint64_t> seed;  // none: a fresh seed per call
  std::vector<std::string> stop;      // stop strings, not part of the output
  std::vector<std::int32_t> stop_tokens;
  bool ignore_eos = false;
};

namespace detail {
// The C params of `options`. `stops` receives the stop strings' pointers (into options.stop):
// both must outlive every use of the result.
inline xserv_generate_params to_c(const GenerateOptions& options, std::vector<const char*>& stops) {
  xserv_generate_params p = xserv_generate_default_params();
  p.max_tokens = options.max_tokens;
  p.temperature = options.temperature;
  p.top_k = options.top_k;
  p.top_p = options.top_p;
  p.min_p = options.min_p;
  p.repetition_penalty = options.repetition_penalty;
  p.presence_penalty = options.presence_penalty;
  p.frequency_penalty = options.frequency_penalty;
  p.seed = options.seed ? *options.seed : XSERV_SEED_RANDOM;
  stops.clear();
  stops.reserve(options.stop.size());
  for (const std::string& s : options.stop) stops.push_back(s.c_str());
  p.stop_strings = stops.data();
  p.n_stop_strings = stops.size();
  p.stop_tokens = options.stop_tokens.data();
  p.n_stop_tokens = options.stop_tokens.size();
  p.ignore_eos = options.ignore_eos;
  return p;
}
}  // namespace detail

// One generated token. `text` is valid during the callback only.
struct TokenEvent {
  std::int32_t token = 0;
  std::string_view text;
  FinishReason finish = FinishReason::none;
};
// Return false to stop generation. An exception it throws stops generation and is rethrown by
// generate().
using TokenCallback = std::function<bool(const TokenEvent&)>;

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// A loaded model. Movable, not copyable; the destructor frees it.
class Model {
 public:
  // Throws Error (NOT_FOUND, FORMAT, UNSUPPORTED, CANCELLED, ...) naming the cause.
  static Model load(const std::string& path, const ModelOptions& options = {}) {
    xserv_model_params p = xserv_model_default_params();
    p.device = static_cast<xserv_device>(options.device);
    p.device_index = options.device_index;
    p.n_threads = options.threads;
    p.dtype = static_cast<xserv_dtype>(options.dtype);
    p.max_batch_tokens = options.max_batch_tokens;
    p.tensor_parallel_size = options.tensor_parallel_size;
    p.kv_cache_dtype = static_cast<xserv_dtype>(options.kv_cache_dtype);
    Hook<std::function<bool(float)>> hook{&options.on_progress, nullptr};
    if (options.on_progress) {
      p.progress_callback = &progress_trampoline;
      p.progress_user_data = &hook;
    }
    xserv_model* raw = nullptr;
    const xserv_status status = xserv_model_load(path.c_str(), &p, &raw);
    if (hook.error) std::rethrow_exception(hook.error);
    detail::check(status);
    return Model(raw);
  }

  Model(Model&& other) noexcept : model_(std::exchange(other.model_, nullptr)) {}
  Model& operator=(Model&& other) noexcept {
    if (this != &other) {
      xserv_model_free(model_);
      model_ = std::exchange(other.model_, nullptr);
    }
    return *this;
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model() { xserv_model_free(model_); }

  std::int32_t n_vocab() const { return xserv_model_n_vocab(model_); }
  std::int32_t n_ctx() const { return xserv_model_n_ctx(model_); }
  std::int32_t n_layer() const { return xserv_model_n_layer(model_); }
  std::int32_t n_embd() const { return xserv_model_n_embd(model_); }
  std::int32_t n_head() const { return xserv_model_n_head(model_); }
  std::int32_t n_head_kv() const { return xserv_model_n_head_kv(model_); }
  std::string arch() const { return string_or_throw(xserv_model_arch(model_)); }
  std::string device() const { return string_or_throw(xserv_model_device(model_)); }
  std::string desc() const { return string_or_throw(xserv_model_desc(model_)); }
  bool has_chat_template() const { return xserv_model_has_chat_template(model_); }

  // allow_special = false encodes special-token text such as "<|im_start|>" as plain text.
  std::vector<std::int32_t> tokenize(const std::string& text, bool allow_special = true) const {
    std::vector<std::int32_t> ids(text.size() / 2 + 8);
    std::size_t n = 0;
    xserv_status s = xserv_tokenize(model_, text.c_str(), allow_special, ids.data(), ids.size(), &n);
    if (s == XSERV_ERR_BUFFER_TOO_SMALL) {
      ids.resize(n);
      s = xserv_tokenize(model_, text.c_str(), allow_special, ids.data(), ids.size(), &n);
    }
    detail::check(s);
    ids.resize(n);
    return ids;
  }

  std::string detokenize(const std::vector<std::int32_t>& ids, bool skip_special = false) const {
    return detokenize(ids.data(), ids.size(), skip_special);
  }
  std::string detokenize(const std::int32_t* ids, std::size_t n, bool skip_special = false) const {
    return read_text([&](char* buf, std::size_t cap, std::size_t* len) {
      return xserv_detokenize(model_, ids, n, skip_special, buf, cap, len);
    });
  }

  // Throws Error(XSERV_ERR_UNSUPPORTED) when the model has no chat template.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = true,
                                  bool enable_thinking = true) const {
    std::vector<xserv_chat_message> c;
    c.reserve(messages.size());
    for (const ChatMessage& m : messages) c.push_back({m.role.c_str(), m.content.c_str()});
    return read_text([&](char* buf, std::size_t cap, std::size_t* len) {
      return xserv_apply_chat_template(model_, c.data(), c.size(), add_generation_prompt,
                                       enable_thinking, buf, cap, len);
    });
  }

  // The ids of the conversation's prompt; special-token text inside a message stays text
  // (xserv_tokenize_chat). Use this, not tokenize(apply_chat_template(...)), for user input.
  std::vector<std::int32_t> tokenize_chat(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt = true,
                                          bool enable_thinking = true) const {
    std::vector<xserv_chat_message> c;
    c.reserve(messages.size());
    std::size_t bytes = 0;
    for (const ChatMessage& m : messages) {
      c.push_back({m.role.c_str(), m.content.c_str()});
      bytes += m.content.size();
    }
    std::vector<std::int32_t> ids(bytes / 2 + 16 * messages.size() + 16);
    std::size_t n = 0;
    auto call = [&] {
      return xserv_tokenize_chat(model_, c.data(), c.size(), add_generation_prompt,
                                 enable_thinking, ids.data(), ids.size(), &n);
    };
    xserv_status s = call();
    if (s == XSERV_ERR_BUFFER_TOO_SMALL) {
      ids.resize(n);
      s = call();
    }
    detail::check(s);
    ids.resize(n);
    return ids;
  }

  // Blocks until generation ends; returns the whole generated text (no stop string).
  std::string generate(const std::string& prompt, const GenerateOptions& options = {},
                       const TokenCallback& on_token = {}) {
    std::vector<const char*> stops;
    const xserv_generate_params p = detail::to_c(options, stops);
    Hook<TokenCallback> hook{&on_token, nullptr};
    char* out = nullptr;
    const xserv_status status = xserv_generate(model_, prompt.c_str(), &p,
                                               on_token ? &token_trampoline : nullptr, &hook, &out);
    std::string text = out ? std::string(out) : std::string();
    xserv_string_free(out);
    if (hook.error) std::rethrow_exception(hook.error);
    detail::check(status);
    return text;
  }

  // The C handle, for calls this wrapper does not cover. Still owned by this object.
  xserv_model* get() const noexcept { return model_; }

 private:
  explicit Model(xserv_model* model) noexcept : model_(model) {}

  // A C++ callable handed through the C callbacks' user_data; an exception it throws is kept
  // here (it must not unwind through C frames) and rethrown once the C call has returned.
  template <typename F>
  struct Hook {
    const F* fn;
    std::exception_ptr error;
  };

  static bool progress_trampoline(float progress, void* user_data) {
    auto* hook = static_cast<Hook<std::function<bool(float)>>*>(user_data);
    try {
      return (*hook->fn)(progress);
    } catch (...) {
      hook->error = std::current_exception();
      return false;
    }
  }

  static bool token_trampoline(const xserv_token_event* e, void* user_data) {
    auto* hook = static_cast<Hook<TokenCallback>*>(user_data);
    try {
      TokenEvent event;
      event.token = e->token;
      event.text = std::string_view(e->text, e->text_len);
      event.finish = static_cast<FinishReason>(e->finish);
      return (*hook->fn)(event);
    } catch (...) {
      hook->error = std::current_exception();
      return false;
    }
  }

  static std::string string_or_throw(const char* s) {
    if (s == nullptr) throw Error(XSERV_ERR_INVALID_ARGUMENT, xserv_last_error());
    return s;
  }

  // Runs a (buffer, capacity, &length) C call, growing the buffer once if it was too small.
  template <typename Call>
  static std::string read_text(Call&& call) {
    std::string buf(256, '\0');
    std::size_t len = 0;
    xserv_status s = call(&buf[0], buf.size(), &len);
    if (s == XSERV_ERR_BUFFER_TOO_SMALL) {
      buf.assign(len + 1, '\0');
      s = call(&buf[0], buf.size(), &len);
    }
    detail::check(s);
    buf.resize(len);
    return buf;
  }

  xserv_model* model_ = nullptr;
};

// ---- engine: continuous batching (xserv_engine_*) --------------------------------------------

// How an engine is created (xserv_engine_params); the defaults are the library's.
struct EngineOptions {
  int max_seqs = 256;          // requests (samples) running at once
  int max_batch_tokens = 0;    // tokens per step; 0: the model's
  std::int64_t kv_cache_tokens = 0;  // KV pool in tokens; 0: sized by the two fields below
  float gpu_memory_fraction = 0.9f;  // CUDA: share of the free device memory for the KV pool
  std::uint64_t kv_cache_bytes = 0;  // CPU: KV pool bytes; 0: enough for max_seqs contexts
  int block_size = 16;         // tokens per KV block
  bool prefix_cache = true;    // reuse the KV of shared prompt prefixes
  int max_waiting = 0;         // queued requests at most (submit throws RESOURCE_EXHAUSTED); 0: no limit
  bool background_thread = false;  // the engine steps on its own thread (never call step())
  int max_prefill_tokens = 0;  // prompt-chunk tokens per step at most; 0: only max_batch_tokens
  int async_steps = -1;        // overlapped steps: 1 on, 0 off, -1 XSERV_ASYNC_STEPS else on for CUDA
};

using RequestId = std::uint64_t;

enum class EventType { token = XSERV_EVENT_TOKEN, finished = XSERV_EVENT_FINISHED };

struct TopLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
};

// One event of a request (xserv_event), copied out of the C event so it can be kept and moved to
// another thread.
struct Event {
  EventType type = EventType::token;
  RequestId request = 0;
  int index = 0;             // which sample, 0 .. n-1
  std::int32_t token = -1;   // the generated id (token events), -1 otherwise
  std::string text;          // text that became safe to show (may be empty)
  float logprob = 0.0f;      // of `token`, when the request asked for logprobs
  std::vector<TopLogprob> top_logprobs;  // most likely first
  FinishReason finish = FinishReason::none;  // none, or why this sample ended
  xserv_status status = XSERV_OK;  // why the request failed (finish is then `error`)
  std::string error;               // the failure's message
  // Valid on the event that ends a sample (finish != none):
  int prompt_tokens = 0;
  int cached_tokens = 0;  // of prompt_tokens, reused from the prefix cache
  int completion_tokens = 0;

  bool ends_sample() const { return finish != FinishReason::none; }
};

// Called on the stepping thread (the caller of step(), or the engine's background thread). It
// must not call step() or destroy the engine; it may call submit/cancel/poll. It should not
// throw: an exception it throws is rethrown by the step() that ran it (with background_thread
// it is dropped).
using EventCallback = std::function<void(const Event&)>;

// One request: exactly one of prompt, prompt_tokens or messages is non-empty.
struct Request {
  std::string prompt;                      // raw text (special tokens not parsed)
  std::vector<std::int32_t> prompt_tokens; // or token ids
  std::vector<ChatMessage> messages;       // or a conversation (the model's chat template)
  bool enable_thinking = false;            // messages: Qwen3's thinking block
  GenerateOptions options;                 // sampling and stopping
  int n = 1;                               // independent samples sharing the prompt
  int logprobs = 0;                        // top log-probabilities per token, 0..20
  EventCallback on_event;                  // empty: events are read with poll()
};

struct EngineStats {
  int running = 0;
  int waiting = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;
  int block_size = 0;
  std::uint64_t prefix_queries = 0;
  std::uint64_t prefix_hits = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t steps = 0;
  std::uint64_t prompt_tokens = 0;  // computed (prefix-cache hits not counted)
  std::uint64_t generated_tokens = 0;
};

namespace detail {
inline Event to_event(const xserv_event& e) {
  Event out;
  out.type = static_cast<EventType>(e.type);
  out.request = e.request;
  out.index = e.index;
  out.token = e.token;
  out.text.assign(e.text != nullptr ? e.text : "", e.text != nullptr ? e.text_len : 0);
  out.logprob = e.logprob;
  if (e.top_logprobs != nullptr) {
    out.top_logprobs.reserve(e.n_top_logprobs);
    for (std::size_t i = 0; i < e.n_top_logprobs; ++i)
      out.top_logprobs.push_back({e.top_logprobs[i].token, e.top_logprobs[i].logprob});
  }
  out.finish = static_cast<FinishReason>(e.finish);
  out.status = e.status;
  out.error = e.error != nullptr ? e.error : "";
  out.prompt_tokens = e.prompt_tokens;
  out.cached_tokens = e.cached_tokens;
  out.completion_tokens = e.completion_tokens;
  return out;
}
}  // namespace detail

// An engine over a model (which must outlive it): submit requests from any thread, drive it with
// step() from one thread (or let it step on its own thread with background_thread). Movable, not
// copyable; the destructor stops it and drops every request without further events.
// Thread-safety is the C API's: submit, cancel, poll, has_work and stats from any thread.
class Engine {
 public:
  explicit Engine(Model& model, const EngineOptions& options = {})
      : callbacks_(std::make_unique<Callbacks>()) {
    xserv_engine_params p = xserv_engine_default_params();
    p.max_seqs = options.max_seqs;
    p.max_batch_tokens = options.max_batch_tokens;
    p.kv_cache_tokens = options.kv_cache_tokens;
    p.gpu_memory_fraction = options.gpu_memory_fraction;
    p.kv_cache_bytes = options.kv_cache_bytes;
    p.block_size = options.block_size;
    p.prefix_cache = options.prefix_cache;
    p.max_waiting = options.max_waiting;
    p.background_thread = options.background_thread;
    p.max_prefill_tokens = options.max_prefill_tokens;
    p.async_steps = options.async_steps;
    detail::check(xserv_engine_create(model.get(), &p, &engine_));
  }

  Engine(Engine&& other) noexcept
      : engine_(std::exchange(other.engine_, nullptr)), callbacks_(std::move(other.callbacks_)) {}
  Engine& operator=(Engine&& other) noexcept {
    if (this != &other) {
      xserv_engine_free(engine_);
      engine_ = std::exchange(other.engine_, nullptr);
      callbacks_ = std::move(other.callbacks_);
    }
    return *this;
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Frees the engine first (no callback runs after that), then the callbacks.
  ~Engine() { xserv_engine_free(engine_); }

  // Queues a request and returns its id. Throws Error: INVALID_ARGUMENT (no prompt or several,
  // bad options, a prompt past the context), UNSUPPORTED (messages without a chat template),
  // RESOURCE_EXHAUSTED (max_waiting requests already queued).
  RequestId submit(const Request& request) {
    xserv_request r;
    xserv_request_init(&r);
    std::vector<xserv_chat_message> messages;
    if (!request.messages.empty()) {
      messages.reserve(request.messages.size());
      for (const ChatMessage& m : request.messages) messages.push_back({m.role.c_str(), m.content.c_str()});
      r.messages = messages.data();
      r.n_messages = messages.size();
    }
    if (!request.prompt.empty()) r.prompt = request.prompt.c_str();
    if (!request.prompt_tokens.empty()) {
      r.prompt_tokens = request.prompt_tokens.data();
      r.n_prompt_tokens = request.prompt_tokens.size();
    }
    r.enable_thinking = request.enable_thinking;
    std::vector<const char*> stops;
    const xserv_generate_params p = detail::to_c(request.options, stops);
    r.params = &p;
    r.n = request.n;
    r.logprobs = request.logprobs;
    Hook* hook = nullptr;
    if (request.on_event) {
      hook = callbacks_->add(request.on_event, request.n);
      r.on_event = &event_trampoline;
      r.user_data = hook;
    }
    xserv_request_id id = 0;
    const xserv_status status = xserv_engine_submit(engine_, &r, &id);
    if (status != XSERV_OK) {
      const std::string message = xserv_last_error();
      if (hook != nullptr) callbacks_->remove(hook);
      throw Error(status, message);
    }
    return id;
  }

  // Runs one step (see xserv_engine_step) and returns the number of events it produced. Rethrows
  // the first exception an event callback threw during the step.
  std::size_t step() {
    std::size_t n = 0;
    const xserv_status status = xserv_engine_step(engine_, &n);
    if (std::exception_ptr error = callbacks_->take_error()) std::rethrow_exception(error);
    detail::check(status);
    return n;
  }

  // Ends a request (its samples finish with FinishReason::cancelled). Unknown ids are ignored.
  void cancel(RequestId id) { detail::check(xserv_engine_cancel(engine_, id)); }

  bool has_work() const { return xserv_engine_has_work(engine_); }

  // The oldest queued event of the requests submitted without a callback; none when empty.
  std::optional<Event> poll() {
    xserv_event e{};
    bool got = false;
    detail::check(xserv_engine_poll(engine_, &e, &got));
    if (!got) return std::nullopt;
    return detail::to_event(e);
  }

  EngineStats stats() const {
    xserv_engine_stats s{};
    s.struct_size = sizeof(s);
    detail::check(xserv_engine_get_stats(engine_, &s));
    EngineStats out;
    out.running = s.running;
    out.waiting = s.waiting;
    out.kv_blocks_total = s.kv_blocks_total;
    out.kv_blocks_used = s.kv_blocks_used;
    out.block_size = s.block_size;
    out.prefix_queries = s.prefix_queries;
    out.prefix_hits = s.prefix_hits;
    out.preemptions = s.preemptions;
    out.steps = s.steps;
    out.prompt_tokens = s.prompt_tokens;
    out.generated_tokens = s.generated_tokens;
    return out;
  }

  // The C handle, for calls this wrapper does not cover. Still owned by this object.
  xserv_engine* get() const noexcept { return engine_; }

 private:
  // A request's callback, kept until its n samples have ended (or the engine is freed).
  struct Callbacks;
  struct Hook {
    Callbacks* owner;
    EventCallback fn;
    int samples_left;
  };
  struct Callbacks {
    std::mutex mutex;
    std::map<Hook*, std::unique_ptr<Hook>> hooks;
    std::exception_ptr error;  // the first exception a callback threw, for step()

    Hook* add(const EventCallback& fn, int n) {
      auto hook = std::make_unique<Hook>(Hook{this, fn, n < 1 ? 1 : n});
      Hook* raw = hook.get();
      std::lock_guard<std::mutex> lock(mutex);
      hooks.emplace(raw, std::move(hook));
      return raw;
    }
    void remove(Hook* hook) {
      std::lock_guard<std::mutex> lock(mutex);
      hooks.erase(hook);
    }
    void keep_error(std::exception_ptr e) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::move(e);
    }
    std::exception_ptr take_error() {
      std::lock_guard<std::mutex> lock(mutex);
      return std::exchange(error, nullptr);
    }
  };

  // Events of one request come from one thread at a time, so samples_left needs no lock.
  static void event_trampoline(const xserv_event* e, void* user_data) {
    Hook* hook = static_cast<Hook*>(user_data);
    try {
      hook->fn(detail::to_event(*e));
    } catch (...) {
      hook->owner->keep_error(std::current_exception());
    }
    if (e->finish != XSERV_FINISH_NONE && --hook->samples_left == 0) hook->owner->remove(hook);
  }

  xserv_engine* engine_ = nullptr;
  std::unique_ptr<Callbacks> callbacks_;
};

}  // inline namespace v0
}  // namespace xserv
