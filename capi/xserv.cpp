// The extern "C" facade over xserv's C++ internals. Every entry point catches everything: no
// exception crosses the C boundary, failures become an xserv_status plus a thread-local message.
//
// Shape of every fallible entry point: `return guard("name", [&] { ...; });` — guard() runs the
// body, maps xserv::Error / std::bad_alloc / anything else onto a status and records the
// message. Objects are owned by RAII members of xserv_model, so an exception on any path
// releases what was built so far.
#include "xserv.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "core/utf8.hpp"
#include "engine/engine.hpp"
#include "engine/generate.hpp"
#include "engine/sampling_params.hpp"
#include "models/model.hpp"
#include "models/model_group.hpp"
#include "tokenizer/tokenizer.hpp"
#include "xserv/version.hpp"

static_assert(XSERV_VERSION_MAJOR == XSERV_PROJECT_VERSION_MAJOR &&
                  XSERV_VERSION_MINOR == XSERV_PROJECT_VERSION_MINOR &&
                  XSERV_VERSION_PATCH == XSERV_PROJECT_VERSION_PATCH,
              "capi/xserv.h and CMakeLists.txt disagree on the version");

// The handle behind the opaque pointer. Members are declared in dependency order so that they
// are destroyed in reverse: xserv_generate's engine (KV cache) before the model before the
// backend. The tokenizer is immutable and thread-safe: tokenizer calls take no lock.
struct xserv_model {
  // The model's ranks (one without tensor parallelism); model and backend are rank 0's.
  std::unique_ptr<xserv::ModelGroup> group;
  xserv::Model* model = nullptr;
  xserv::Backend* backend = nullptr;
  std::unique_ptr<xserv::Tokenizer> tokenizer;
  std::unique_ptr<xserv::Engine> generate_engine;  // xserv_generate's, made at its first call
  std::string arch;
  std::string device;
  std::string desc;
  // Serializes xserv_generate calls on one model (they share generate_engine). Recursive so that
  // a reentrant call from a token callback is detected (`generating`) instead of deadlocking.
  std::recursive_mutex mutex;
  bool generating = false;
};

// An engine handle: the C++ engine over a model the host keeps alive.
struct xserv_engine {
  xserv_model* model = nullptr;
  std::unique_ptr<xserv::Engine> engine;
};

namespace {

using xserv::ErrorCode;

thread_local std::string g_last_error;

xserv_status to_status(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return XSERV_OK;
    case ErrorCode::invalid_argument: return XSERV_ERR_INVALID_ARGUMENT;
    case ErrorCode::not_found: return XSERV_ERR_NOT_FOUND;
    case ErrorCode::io: return XSERV_ERR_IO;
    case ErrorCode::format: return XSERV_ERR_FORMAT;
    case ErrorCode::unsupported: return XSERV_ERR_UNSUPPORTED;
    case ErrorCode::out_of_memory: return XSERV_ERR_OUT_OF_MEMORY;
    case ErrorCode::resource_exhausted: return XSERV_ERR_RESOURCE_EXHAUSTED;
    case ErrorCode::cuda: return XSERV_ERR_CUDA;
    case ErrorCode::cancelled: return XSERV_ERR_CANCELLED;
    case ErrorCode::internal: return XSERV_ERR_INTERNAL;
  }
  return XSERV_ERR_INTERNAL;
}

// Records the message of a failure. Never throws: if even the message cannot be stored (out of
// memory), the old one is cleared rather than left misleading.
xserv_status fail(xserv_status status, const char* where, const char* message) noexcept {
  try {
    g_last_error.assign(where);
    g_last_error.append(": ");
    g_last_error.append(message);
  } catch (...) {
    g_last_error.clear();
  }
  return status;
}

// A failure raised inside a body with its own status (BUFFER_TOO_SMALL has no ErrorCode).
struct StatusError {
  xserv_status status;
  std::string message;
};

[[noreturn]] void throw_status(xserv_status status, std::string message) {
  throw StatusError{status, std::move(message)};
}
[[noreturn]] void throw_invalid(std::string message) {
  throw_status(XSERV_ERR_INVALID_ARGUMENT, std::move(message));
}

template <typename Body>
xserv_status guard(const char* where, Body&& body) noexcept {
  try {
    body();
    return XSERV_OK;
  } catch (const StatusError& e) {
    return fail(e.status, where, e.message.c_str());
  } catch (const xserv::Error& e) {
    return fail(to_status(e.code()), where, e.what());
  } catch (const std::bad_alloc&) {
    return fail(XSERV_ERR_OUT_OF_MEMORY, where, "out of host memory");
  } catch (const std::exception& e) {
    return fail(XSERV_ERR_INTERNAL, where, e.what());
  } catch (...) {
    return fail(XSERV_ERR_INTERNAL, where, "unknown exception");
  }
}

void require(const void* p, const char* name) {
  if (p == nullptr) throw_invalid(std::string(name) + " is NULL");
}

std::string_view checked_utf8(const char* text, const char* name) {
  require(text, name);
  std::string_view view(text);
  const std::size_t bad = xserv::utf8::find_invalid(view);
  if (bad != std::string_view::npos)
    throw_invalid(std::string(name) + " is not valid UTF-8 (first bad byte at offset " +
                  std::to_string(bad) + ")");
  return view;
}

// Writes `ids` into a caller buffer under the (buffer, capacity, &count) rule; `what` names
// their source in the too-small message ("the text has 12 tokens, the buffer holds 8").
void write_ids(const std::vector<int32_t>& ids, const char* what, int32_t* out,
               std::size_t capacity, std::size_t* count) {
  *count = ids.size();
  if (capacity < ids.size())
    throw_status(XSERV_ERR_BUFFER_TOO_SMALL, std::string(what) + " has " +
                                                 std::to_string(ids.size()) +
                                                 " tokens, the buffer holds " +
                                                 std::to_string(capacity));
  if (!ids.empty()) std::memcpy(out, ids.data(), ids.size() * sizeof(int32_t));
}

// Writes `text` plus a NUL into a caller buffer under the (buffer, capacity, &length) rule.
void write_text(std::string_view text, char* out, std::size_t capacity, std::size_t* length) {
  *length = text.size();
  if (capacity < text.size() + 1)
    throw_status(XSERV_ERR_BUFFER_TOO_SMALL, "the text needs " + std::to_string(text.size() + 1) +
                                                 " bytes, the buffer has " +
                                                 std::to_string(capacity));
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
}

void check_buffer(const void* buffer, std::size_t capacity, const char* name) {
  if (buffer == nullptr && capacity > 0) throw_invalid(std::string(name) + " is NULL but capacity > 0");
}

// The messages of a C conversation, each role and content checked as UTF-8; `name` names the
// array in messages ("request->messages[2].content is not valid UTF-8 ...").
std::vector<xserv::Tokenizer::Message> checked_conversation(const xserv_chat_message* messages,
                                                            std::size_t n, const char* name) {
  check_buffer(messages, n, name);
  std::vector<xserv::Tokenizer::Message> conversation;
  conversation.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string at = std::string(name) + "[" + std::to_string(i) + "]";
    xserv::Tokenizer::Message msg;
    msg.role = checked_utf8(messages[i].role, (at + ".role").c_str());
    msg.content = checked_utf8(messages[i].content, (at + ".content").c_str());
    conversation.push_back(std::move(msg));
  }
  return conversation;
}

// malloc'd copy for xserv_string_free (free() is what the C side can rely on).
char* c_string(std::string_view s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p == nullptr) throw std::bad_alloc();
  std::memcpy(p, s.data(), s.size());
  p[s.size()] = '\0';
  return p;
}

// The getters cannot return a status; a NULL model is recorded and answered with `fallback`.
template <typename T, typename Get>
T get(const xserv_model* model, const char* where, T fallback, Get&& getter) noexcept {
  if (model == nullptr) {
    fail(XSERV_ERR_INVALID_ARGUMENT, where, "model is NULL");
    return fallback;
  }
  return getter(*model);
}

xserv::SamplingParams to_sampling(const xserv_generate_params& p) {
  xserv::SamplingParams s;
  s.max_tokens = p.max_tokens;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repetition_penalty = p.repetition_penalty;
  s.presence_penalty = p.presence_penalty;
  s.frequency_penalty = p.frequency_penalty;
  if (p.seed != XSERV_SEED_RANDOM) s.seed = p.seed;
  if (p.n_stop_strings > 0) {
    require(p.stop_strings, "params->stop_strings");
    for (std::size_t i = 0; i < p.n_stop_strings; ++i) {
      const std::string name = "params->stop_strings[" + std::to_string(i) + "]";
      s.stop_strings.emplace_back(checked_utf8(p.stop_strings[i], name.c_str()));
    }
  }
  if (p.n_stop_tokens > 0) {
    require(p.stop_tokens, "params->stop_tokens");
    s.stop_token_ids.assign(p.stop_tokens, p.stop_tokens + p.n_stop_tokens);
  }
  s.ignore_eos = p.ignore_eos;
  s.validate();
  return s;
}

xserv_finish_reason to_finish(xserv::FinishReason r) noexcept {
  switch (r) {
    case xserv::FinishReason::none: return XSERV_FINISH_NONE;
    case xserv::FinishReason::stop: return XSERV_FINISH_STOP;
    case xserv::FinishReason::length: return XSERV_FINISH_LENGTH;
    case xserv::FinishReason::cancelled: return XSERV_FINISH_CANCELLED;
    case xserv::FinishReason::error: return XSERV_FINISH_ERROR;
  }
  return XSERV_FINISH_NONE;
}

// A params struct of the C ABI read under the growing-structs rule: the caller's fields up to
// its struct_size over the defaults for the rest.
template <typename T>
T read_sized(const T* given, const T& defaults, const char* name) {
  if (given == nullptr) return defaults;
  const std::size_t n = given->struct_size;
  if (n < sizeof(std::size_t))
    throw_invalid(std::string(name) + "->struct_size is " + std::to_string(n) +
                  " (start from the *_default_params() / *_init() function)");
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), static_cast<const void*>(given), std::min(n, sizeof(T)));
  out.struct_size = sizeof(T);
  return out;
}

// The integer a C caller stored in an enum field. C allows any int there, but in C++ loading
// an enum object whose value lies outside the enumerators' range is undefined (UBSan flags it),
// so enums that come from C are read as their underlying integer and checked.
template <typename Enum>
long long enum_value(const Enum& e) noexcept {
  std::underlying_type_t<Enum> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<long long>(v);
}

xserv::DeviceKind pick_device(long long device) {
  switch (device) {
    case XSERV_DEVICE_AUTO:
      return xserv::cuda_available() ? xserv::DeviceKind::cuda : xserv::DeviceKind::cpu;
    case XSERV_DEVICE_CPU: return xserv::DeviceKind::cpu;
    case XSERV_DEVICE_CUDA: return xserv::DeviceKind::cuda;
  }
  throw_invalid("params->device is " + std::to_string(device) + ", not an xserv_device");
}

std::string_view dtype_name_c(long long d, const char* field = "params->dtype") {
  switch (d) {
    case XSERV_DTYPE_AUTO: return "auto";
    case XSERV_DTYPE_F32: return "f32";
    case XSERV_DTYPE_F16: return "f16";
    case XSERV_DTYPE_BF16: return "bf16";
  }
  throw_invalid(std::string(field) + " is " + std::to_string(d) + ", not an xserv_dtype");
}

// Thrown from the progress hook to unwind a load the host cancelled.
struct LoadCancelled {};

}  // namespace

extern "C" {

const char* xserv_version(void) { return XSERV_VERSION_STRING; }

bool xserv_cuda_available(void) { return xserv::cuda_available(); }

const char* xserv_status_string(xserv_status status) {
  switch (enum_value(status)) {
    case XSERV_OK: return "ok";
    case XSERV_ERR_INVALID_ARGUMENT: return "invalid argument";
    case XSERV_ERR_NOT_FOUND: return "not found";
    case XSERV_ERR_IO: return "I/O error";
    case XSERV_ERR_FORMAT: return "format error";
    case XSERV_ERR_UNSUPPORTED: return "unsupported";
    case XSERV_ERR_OUT_OF_MEMORY: return "out of memory";
    case XSERV_ERR_RESOURCE_EXHAUSTED: return "resource exhausted";
    case XSERV_ERR_CUDA: return "CUDA error";
    case XSERV_ERR_CANCELLED: return "cancelled";
    case XSERV_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case XSERV_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* xserv_last_error(void) { return g_last_error.c_str(); }

void xserv_string_free(char* str) { std::free(str); }

xserv_model_params xserv_model_default_params(void) {
  xserv_model_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.device = XSERV_DEVICE_AUTO;
  p.device_index = 0;
  p.n_threads = 0;
  p.dtype = XSERV_DTYPE_AUTO;
  p.max_batch_tokens = 0;
  p.progress_callback = nullptr;
  p.progress_user_data = nullptr;
  p.tensor_parallel_size = 1;
  p.kv_cache_dtype = XSERV_DTYPE_AUTO;
  return p;
}

xserv_status xserv_model_load(const char* path, const xserv_model_params* params,
                              xserv_model** out_model) {
  if (out_model != nullptr) *out_model = nullptr;
  return guard("xserv_model_load", [&] {
    require(out_model, "out_model");
    require(path, "path");
    if (*path == '\0') throw_invalid("path is empty");
    const xserv_model_params p = read_sized(params, xserv_model_default_params(), "params");
    if (p.n_threads < 0) throw_invalid("params->n_threads is negative");
    if (p.max_batch_tokens < 0) throw_invalid("params->max_batch_tokens is negative");
    if (p.device_index < 0) throw_invalid("params->device_index is negative");
    if (p.tensor_parallel_size < 1 || p.tensor_parallel_size > 1024)
      throw_invalid("params->tensor_parallel_size is " + std::to_string(p.tensor_parallel_size) +
                    " (expected 1 ..= 1024)");
    const std::string_view wanted_dtype = dtype_name_c(enum_value(p.dtype));
    const std::string_view kv_dtype = dtype_name_c(enum_value(p.kv_cache_dtype), "params->kv_cache_dtype");

    auto m = std::make_unique<xserv_model>();
    xserv::ParallelOptions po;
    po.device = pick_device(enum_value(p.device));
    po.size = p.tensor_parallel_size;
    po.threads = static_cast<std::size_t>(p.n_threads);
    for (int32_t r = 0; r < p.tensor_parallel_size; ++r) po.devices.push_back(p.device_index + r);

    xserv::ModelOptions mo;
    if (p.max_batch_tokens > 0) mo.max_batch_tokens = p.max_batch_tokens;
    if (kv_dtype == "f32") mo.kv_dtype = xserv::DType::f32;
    else if (kv_dtype == "f16") mo.kv_dtype = xserv::DType::f16;
    else if (kv_dtype == "bf16") mo.kv_dtype = xserv::DType::bf16;
    bool cancelled = false;
    if (p.progress_callback != nullptr) {
      // Weights are most of the work; the tokenizer after them is reported as the final 1.
      mo.on_progress = [&p, &cancelled](std::size_t done, std::size_t total) {
        const float f = total ? 0.99f * static_cast<float>(done) / static_cast<float>(total) : 0.0f;
        if (!p.progress_callback(f, p.progress_user_data)) {
          cancelled = true;
          throw LoadCancelled{};
        }
      };
    }
    try {
      m->group = xserv::ModelGroup::load(path, po, mo);
      m->model = &m->group->leader();
      m->backend = &m->model->backend();
    } catch (const LoadCancelled&) {
      throw_status(XSERV_ERR_CANCELLED, "cancelled by the progress callback");
    }
    if (cancelled) throw_status(XSERV_ERR_CANCELLED, "cancelled by the progress callback");
    const xserv::ModelConfig& c = m->model->config();
    const std::string_view have_dtype = xserv::dtype_name(m->model->weight_dtype());
    if (wanted_dtype != "auto" && wanted_dtype != have_dtype)
      throw_status(XSERV_ERR_UNSUPPORTED, "params->dtype asks for " + std::string(wanted_dtype) +
                                              " but the checkpoint is " + std::string(have_dtype) +
                                              " (conversion at load is not supported)");

    m->tokenizer = std::make_unique<xserv::Tokenizer>(xserv::Tokenizer::load(path));
    m->model->check_tokenizer(m->tokenizer->vocab_size(), path);
    // Engines read generation_config.json's end ids when they are made; read them here too, so
    // a broken file fails the load (FORMAT) rather than the first xserv_generate or engine
    // (found by fuzz_model_load).
    (void)xserv::load_eos_token_ids(path, c);
    m->arch = std::string(xserv::arch_name(c.arch));
    m->device = std::string(xserv::device_name(m->backend->device().kind));
    m->desc = m->arch + ", " + std::to_string(c.num_layers) + " layers, " +
              std::to_string(c.hidden_size) + " wide, " +
              std::to_string(m->tokenizer->vocab_size()) + " tokens, " + std::string(have_dtype) +
              " on " + m->backend->name() +
              (po.size > 1 ? " (tensor parallel over " + std::to_string(po.size) + " ranks)" : "");
    if (p.progress_callback != nullptr && !p.progress_callback(1.0f, p.progress_user_data))
      throw_status(XSERV_ERR_CANCELLED, "cancelled by the progress callback");
    *out_model = m.release();
  });
}

void xserv_model_free(xserv_model* model) { delete model; }

int32_t xserv_model_n_vocab(const xserv_model* model) {
  return get(model, "xserv_model_n_vocab", int32_t{0},
             [](const xserv_model& m) { return static_cast<int32_t>(m.tokenizer->vocab_size()); });
}
int32_t xserv_model_n_ctx(const xserv_model* model) {
  return get(model, "xserv_model_n_ctx", int32_t{0},
             [](const xserv_model& m) { return m.model->config().max_position_embeddings; });
}
int32_t xserv_model_n_layer(const xserv_model* model) {
  return get(model, "xserv_model_n_layer", int32_t{0},
             [](const xserv_model& m) { return m.model->config().num_layers; });
}
int32_t xserv_model_n_embd(const xserv_model* model) {
  return get(model, "xserv_model_n_embd", int32_t{0},
             [](const xserv_model& m) { return m.model->config().hidden_size; });
}
int32_t xserv_model_n_head(const xserv_model* model) {
  return get(model, "xserv_model_n_head", int32_t{0},
             [](const xserv_model& m) { return m.model->config().num_heads; });
}
int32_t xserv_model_n_head_kv(const xserv_model* model) {
  return get(model, "xserv_model_n_head_kv", int32_t{0},
             [](const xserv_model& m) { return m.model->config().num_kv_heads; });
}
const char* xserv_model_arch(const xserv_model* model) {
  return get(model, "xserv_model_arch", static_cast<const char*>(nullptr),
             [](const xserv_model& m) { return m.arch.c_str(); });
}
const char* xserv_model_device(const xserv_model* model) {
  return get(model, "xserv_model_device", static_cast<const char*>(nullptr),
             [](const xserv_model& m) { return m.device.c_str(); });
}
const char* xserv_model_desc(const xserv_model* model) {
  return get(model, "xserv_model_desc", static_cast<const char*>(nullptr),
             [](const xserv_model& m) { return m.desc.c_str(); });
}
bool xserv_model_has_chat_template(const xserv_model* model) {
  return get(model, "xserv_model_has_chat_template", false,
             [](const xserv_model& m) { return m.tokenizer->has_chat_template(); });
}

xserv_status xserv_tokenize(const xserv_model* model, const char* text, bool allow_special,
                            int32_t* tokens, size_t capacity, size_t* n_tokens) {
  if (n_tokens != nullptr) *n_tokens = 0;
  return guard("xserv_tokenize", [&] {
    require(model, "model");
    require(n_tokens, "n_tokens");
    check_buffer(tokens, capacity, "tokens");
    const std::string_view view = checked_utf8(text, "text");
    write_ids(model->tokenizer->encode(view, allow_special), "the text", tokens, capacity,
              n_tokens);
  });
}

xserv_status xserv_detokenize(const xserv_model* model, const int32_t* tokens, size_t n_tokens,
                              bool skip_special, char* text, size_t capacity, size_t* length) {
  if (length != nullptr) *length = 0;
  return guard("xserv_detokenize", [&] {
    require(model, "model");
    require(length, "length");
    check_buffer(tokens, n_tokens, "tokens");
    check_buffer(text, capacity, "text");
    // The model's embedding may have padding rows past the tokenizer's ids; both are valid ids.
    const std::int64_t vocab =
        std::max<std::int64_t>(model->tokenizer->vocab_size(), model->model->config().vocab_size);
    for (std::size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= vocab)
        throw_invalid("tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[i]) +
                      " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    const std::string s = model->tokenizer->decode(
        std::span<const int32_t>(tokens, n_tokens), skip_special);
    write_text(s, text, capacity, length);
  });
}

xserv_status xserv_apply_chat_template(const xserv_model* model,
                                       const xserv_chat_message* messages, size_t n_messages,
                                       bool add_generation_prompt, bool enable_thinking,
                                       char* text, size_t capacity, size_t* length) {
  if (length != nullptr) *length = 0;
  return guard("xserv_apply_chat_template", [&] {
    require(model, "model");
    require(length, "length");
    check_buffer(text, capacity, "text");
    const auto conversation = checked_conversation(messages, n_messages, "messages");
    if (!model->tokenizer->has_chat_template())
      throw_status(XSERV_ERR_UNSUPPORTED, "the model has no chat template");
    const std::string s = model->tokenizer->apply_chat_template(
        conversation, add_generation_prompt, enable_thinking);
    write_text(s, text, capacity, length);
  });
}

xserv_status xserv_tokenize_chat(const xserv_model* model, const xserv_chat_message* messages,
                                 size_t n_messages, bool add_generation_prompt,
                                 bool enable_thinking, int32_t* tokens, size_t capacity,
                                 size_t* n_tokens) {
  if (n_tokens != nullptr) *n_tokens = 0;
  return guard("xserv_tokenize_chat", [&] {
    require(model, "model");
    require(n_tokens, "n_tokens");
    check_buffer(tokens, capacity, "tokens");
    const auto conversation = checked_conversation(messages, n_messages, "messages");
    if (conversation.empty()) throw_invalid("n_messages is 0");
    write_ids(model->tokenizer->encode_chat(conversation, add_generation_prompt, enable_thinking),
              "the conversation", tokens, capacity, n_tokens);
  });
}

xserv_generate_params xserv_generate_default_params(void) {
  xserv_generate_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.max_tokens = 128;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.0f;
  p.seed = XSERV_SEED_RANDOM;
  p.stop_strings = nullptr;
  p.n_stop_strings = 0;
  p.stop_tokens = nullptr;
  p.n_stop_tokens = 0;
  p.ignore_eos = false;
  return p;
}

xserv_status xserv_generate(xserv_model* model, const char* prompt,
                            const xserv_generate_params* params, xserv_token_callback on_token,
                            void* user_data, char** out_text) {
  if (out_text != nullptr) *out_text = nullptr;
  return guard("xserv_generate", [&] {
    require(model, "model");
    const std::string_view view = checked_utf8(prompt, "prompt");
    if (view.empty()) throw_invalid("prompt is empty");
    const xserv_generate_params p = read_sized(params, xserv_generate_default_params(), "params");
    xserv::EngineRequest request;
    request.params = to_sampling(p);
    request.prompt = model->tokenizer->encode(view);

    std::lock_guard lock(model->mutex);
    if (model->generating)
      throw_invalid("called from a token callback of the same model (not reentrant)");
    struct Busy {  // clears the flag on every exit path
      bool& flag;
      explicit Busy(bool& f) : flag(f) { flag = true; }
      ~Busy() { flag = false; }
    } busy(model->generating);
    if (!model->generate_engine)
      model->generate_engine = std::make_unique<xserv::Engine>(
          *model->group, model->tokenizer.get(), xserv::single_sequence_options(*model->model));
    xserv::TokenCallback callback;
    if (on_token != nullptr) {
      callback = [on_token, user_data](const xserv::TokenEvent& e) {
        // string_view -> NUL-terminated text for C.
        const std::string text(e.text);
        xserv_token_event event;
        std::memset(&event, 0, sizeof event);
        event.token = e.token;
        event.text = text.c_str();
        event.text_len = text.size();
        event.finish = to_finish(e.finish);
        return on_token(&event, user_data);
      };
    }
    const xserv::GenerationResult result = xserv::generate(
        *model->generate_engine, request.prompt, request.params, callback);
    if (out_text != nullptr) *out_text = c_string(result.text);
  });
}

// ---- engine ---------------------------------------------------------------------------------

}  // extern "C": the helpers below are C++ with internal linkage (inside the C block clang
   // gave them C linkage and exported them from the static libxserv.a as engine_defaults,
   // request_prompt, ... where a host's own symbols of those names would clash)

namespace {

// The C defaults are the C++ engine's (one place says them: EngineOptions).
xserv_engine_params engine_defaults() {
  const xserv::EngineOptions o;
  xserv_engine_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.max_seqs = o.max_seqs;
  p.max_batch_tokens = o.max_batch_tokens;
  p.kv_cache_tokens = o.kv_cache_tokens;
  p.gpu_memory_fraction = o.gpu_memory_fraction;
  p.kv_cache_bytes = o.kv_cache_bytes;
  p.block_size = o.block_size;
  p.prefix_cache = o.prefix_cache;
  p.max_waiting = o.max_waiting;
  p.background_thread = o.background_thread;
  p.max_prefill_tokens = o.max_prefill_tokens;
  p.async_steps = o.async_steps ? (*o.async_steps ? 1 : 0) : -1;
  return p;
}

xserv_request request_defaults() {
  xserv_request r;
  std::memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  r.n = 1;
  return r;
}

void require_engine(const xserv_engine* engine) {
  if (engine == nullptr || !engine->engine) throw_invalid("engine is NULL");
}

// An engine event as the C ABI shows it. Pointers go into `e` and `top`, which must outlive it.
xserv_event to_c_event(const xserv::EngineEvent& e, std::vector<xserv_top_logprob>& top) {
  top.clear();
  for (const auto& t : e.top_logprobs) top.push_back({t.token, t.logprob});
  xserv_event c;
  std::memset(&c, 0, sizeof c);
  c.type = e.type == xserv::EventType::token ? XSERV_EVENT_TOKEN : XSERV_EVENT_FINISHED;
  c.request = e.request;
  c.index = e.index;
  c.token = e.token;
  c.text = e.text.c_str();
  c.text_len = e.text.size();
  c.logprob = e.logprob;
  c.top_logprobs = top.empty() ? nullptr : top.data();
  c.n_top_logprobs = top.size();
  c.finish = to_finish(e.finish);
  c.status = to_status(e.status);
  c.error = e.error.c_str();
  c.prompt_tokens = e.prompt_tokens;
  c.cached_tokens = e.cached_tokens;
  c.completion_tokens = e.completion_tokens;
  return c;
}

// What xserv_engine_poll handed out last on this thread: its pointers stay valid until the
// same thread polls again.
thread_local xserv::EngineEvent t_polled;
thread_local std::vector<xserv_top_logprob> t_polled_top;

std::vector<int32_t> request_prompt(const xserv_model& model, const xserv_request& r) {
  const int given = (r.prompt != nullptr) + (r.n_prompt_tokens > 0 || r.prompt_tokens != nullptr) +
                    (r.n_messages > 0 || r.messages != nullptr);
  if (given != 1)
    throw_invalid("give exactly one of request->prompt, prompt_tokens or messages (got " +
                  std::to_string(given) + ")");
  if (r.prompt != nullptr) {
    const std::string_view view = checked_utf8(r.prompt, "request->prompt");
    if (view.empty()) throw_invalid("request->prompt is empty");
    return model.tokenizer->encode(view, /*allow_special=*/false);
  }
  if (r.prompt_tokens != nullptr || r.n_prompt_tokens > 0) {
    require(r.prompt_tokens, "request->prompt_tokens");
    if (r.n_prompt_tokens == 0) throw_invalid("request->n_prompt_tokens is 0");
    return std::vector<int32_t>(r.prompt_tokens, r.prompt_tokens + r.n_prompt_tokens);
  }
  require(r.messages, "request->messages");
  if (r.n_messages == 0) throw_invalid("request->n_messages is 0");
  if (!model.tokenizer->has_chat_template())
    throw_status(XSERV_ERR_UNSUPPORTED, "the model has no chat template");
  const auto conversation = checked_conversation(r.messages, r.n_messages, "request->messages");
  // Markers typed in the messages stay text: a player cannot open a system turn.
  return model.tokenizer->encode_chat(conversation, true, r.enable_thinking);
}

}  // namespace

extern "C" {

xserv_engine_params xserv_engine_default_params(void) { return engine_defaults(); }

void xserv_request_init(xserv_request* request) {
  if (request != nullptr) *request = request_defaults();
}

xserv_status xserv_engine_create(xserv_model* model, const xserv_engine_params* params,
                                 xserv_engine** out_engine) {
  if (out_engine != nullptr) *out_engine = nullptr;
  return guard("xserv_engine_create", [&] {
    require(model, "model");
    require(out_engine, "out_engine");
    const xserv_engine_params p = read_sized(params, engine_defaults(), "params");
    xserv::EngineOptions o;
    o.max_seqs = p.max_seqs;
    o.max_batch_tokens = p.max_batch_tokens;
    o.kv_cache_tokens = p.kv_cache_tokens;
    o.gpu_memory_fraction = p.gpu_memory_fraction;
    o.kv_cache_bytes = p.kv_cache_bytes;
    o.block_size = p.block_size;
    o.prefix_cache = p.prefix_cache;
    o.max_waiting = p.max_waiting;
    o.background_thread = p.background_thread;
    o.max_prefill_tokens = p.max_prefill_tokens;
    if (p.async_steps < -1 || p.async_steps > 1)
      throw_invalid("params->async_steps is " + std::to_string(p.async_steps) + " (expected -1, 0 or 1)");
    if (p.async_steps >= 0) o.async_steps = p.async_steps == 1;
    auto e = std::make_unique<xserv_engine>();
    e->model = model;
    e->engine = std::make_unique<xserv::Engine>(*model->group, model->tokenizer.get(), o);
    *out_engine = e.release();
  });
}

void xserv_engine_free(xserv_engine* engine) { delete engine; }

xserv_status xserv_engine_submit(xserv_engine* engine, const xserv_request* request,
                                 xserv_request_id* out_id) {
  if (out_id != nullptr) *out_id = 0;
  return guard("xserv_engine_submit", [&] {
    require_engine(engine);
    require(request, "request");
    require(out_id, "out_id");
    const xserv_request r = read_sized(request, request_defaults(), "request");
    xserv::EngineRequest req;
    const xserv_generate_params gp =
        read_sized(r.params, xserv_generate_default_params(), "request->params");
    req.params = to_sampling(gp);
    req.prompt = request_prompt(*engine->model, r);
    req.n = r.n;
    req.logprobs = r.logprobs;
    if (r.on_event != nullptr) {
      req.on_event = [cb = r.on_event, ud = r.user_data](const xserv::EngineEvent& e) {
        std::vector<xserv_top_logprob> top;
        const xserv_event c = to_c_event(e, top);
        cb(&c, ud);
      };
    }
    *out_id = engine->engine->submit(std::move(req));
  });
}

xserv_status xserv_engine_cancel(xserv_engine* engine, xserv_request_id id) {
  return guard("xserv_engine_cancel", [&] {
    require_engine(engine);
    engine->engine->cancel(id);
  });
}

xserv_status xserv_engine_step(xserv_engine* engine, size_t* n_events) {
  if (n_events != nullptr) *n_events = 0;
  return guard("xserv_engine_step", [&] {
    require_engine(engine);
    const std::size_t n = engine->engine->step();
    if (n_events != nullptr) *n_events = n;
  });
}

bool xserv_engine_has_work(const xserv_engine* engine) {
  if (engine == nullptr || !engine->engine) {
    fail(XSERV_ERR_INVALID_ARGUMENT, "xserv_engine_has_work", "engine is NULL");
    return false;
  }
  return engine->engine->has_work();
}

xserv_status xserv_engine_poll(xserv_engine* engine, xserv_event* out_event, bool* got) {
  if (got != nullptr) *got = false;
  return guard("xserv_engine_poll", [&] {
    require_engine(engine);
    require(out_event, "out_event");
    require(got, "got");
    xserv::EngineEvent e;
    if (!engine->engine->poll(e)) return;
    t_polled = std::move(e);
    *out_event = to_c_event(t_polled, t_polled_top);
    *got = true;
  });
}

xserv_status xserv_engine_get_stats(const xserv_engine* engine, xserv_engine_stats* out) {
  return guard("xserv_engine_get_stats", [&] {
    require_engine(engine);
    require(out, "out");
    const std::size_t n = out->struct_size;
    if (n < sizeof(std::size_t))
      throw_invalid("out->struct_size is " + std::to_string(n) +
                    " (set it to sizeof(xserv_engine_stats))");
    const xserv::EngineStats s = engine->engine->stats();
    xserv_engine_stats c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = std::min(n, sizeof c);
    c.running = s.running;
    c.waiting = s.waiting;
    c.kv_blocks_total = s.kv_blocks_total;
    c.kv_blocks_used = s.kv_blocks_used;
    c.block_size = s.block_size;
    c.prefix_queries = s.prefix_queries;
    c.prefix_hits = s.prefix_hits;
    c.preemptions = s.preemptions;
    c.steps = s.steps;
    c.prompt_tokens = s.prompt_tokens;
    c.generated_tokens = s.generated_tokens;
    std::memcpy(static_cast<void*>(out), &c, std::min(n, sizeof c));
  });
}

}  // extern "C"
