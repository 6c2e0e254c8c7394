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
};

// How a model is loaded (xserv_model_params).
struct ModelOptions {
  Device device = Device::automatic;
  int device_index = 0;
  int threads = 0;  // CPU worker threads; 0: all
  DType dtype = DType::automatic;
  int max_batch_tokens = 0;  // 0: the library's default
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

  // Blocks until generation ends; returns the whole generated text (no stop string).
  std::string generate(const std::string& prompt, const GenerateOptions& options = {},
                       const TokenCallback& on_token = {}) {
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
    std::vector<const char*> stops;
    stops.reserve(options.stop.size());
    for (const std::string& s : options.stop) stops.push_back(s.c_str());
    p.stop_strings = stops.data();
    p.n_stop_strings = stops.size();
    p.stop_tokens = options.stop_tokens.data();
    p.n_stop_tokens = options.stop_tokens.size();
    p.ignore_eos = options.ignore_eos;

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

}  // inline namespace v0
}  // namespace xserv
