// openai.hpp — the OpenAI wire format of xserv-server, with no sockets and no model: request
// bodies in, validated plain structs out; engine events in, response bodies and SSE chunks out.
// Kept apart from the HTTP code so the unit test and the fuzz target (tests/fuzz/) reach every
// branch of the parsing directly.
//
// Contract:
// - parse_request() accepts the body of POST /v1/chat/completions or /v1/completions and either
//   returns a CompletionRequest whose every field is in range, or throws ApiError (status 400,
//   OpenAI's `type` / `param` / `code`). It never crashes on any byte string (fuzzed).
// - The builders write exactly the JSON shapes the official OpenAI SDKs parse: `chat.completion`,
//   `chat.completion.chunk`, `text_completion`, usage with prompt_tokens_details.cached_tokens,
//   logprobs in the chat shape (content[].token/logprob/bytes/top_logprobs) and in the legacy
//   completions shape (tokens/token_logprobs/top_logprobs/text_offset).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace xserv::server {

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string message, std::string param = {},
           std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)),
        param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type;   // "invalid_request_error", "authentication_error", ...
  std::string param;  // the offending request field, "" for none (written as null)
  std::string code;   // a machine-readable code, "" for none (written as null)
};

// 400 invalid_request_error naming `param`.
ApiError invalid_request(std::string message, std::string param = {}, std::string code = {});

// The JSON body of an error response.
std::string error_body(const ApiError& error);

enum class Endpoint { chat, completions };

struct Message {
  std::string role;  // system, user, assistant ("developer" is read as system)
  std::string content;
};

// One prompt of /v1/completions: text, or token ids when the client sent integers.
struct Prompt {
  std::string text;
  std::vector<std::int32_t> tokens;
  bool is_tokens = false;
};

// A validated request. Fields the client left out hold OpenAI's defaults.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::chat;
  std::string model;               // "" when the client sent none
  std::vector<Message> messages;   // chat
  std::vector<Prompt> prompts;     // completions: one or more prompts, each gets n choices
  std::optional<int> max_tokens;   // none: up to the context length
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // extension (vLLM's name): 0 = off
  float min_p = 0.0f;                 // extension
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;    // extension
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;            // extension
  int n = 1;
  bool logprobs = false;  // return the sampled tokens' log-probabilities
  int top_logprobs = 0;   // and this many alternatives per position
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool enable_thinking = false;  // chat_template_kwargs.enable_thinking (Qwen3)
};

// Limits the parser enforces (documented in docs/server.md).
inline constexpr int kMaxN = 16;
inline constexpr int kMaxStop = 16;
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr int kMaxPrompts = 64;

// Parses and validates a request body. Throws ApiError (400) naming the field at fault.
CompletionRequest parse_request(std::string_view body, Endpoint endpoint);

// The prompt of a conversation for a model without a chat template (GPT-2): every message's
// content in order, each followed by a newline, so the model continues the transcript (as
// `xserv-cli chat` does). Roles are not written: a base model knows no roles.
std::string render_plain(const std::vector<Message>& messages);

// One sampled position's log-probabilities, as the engine reported them.
struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<std::int32_t, float>> top;  // most likely first
};

// What one choice has produced so far.
struct Choice {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;  // "stop", "length" ("" while running)
};

struct Usage {
  int prompt_tokens = 0;
  int cached_tokens = 0;
  int completion_tokens = 0;
};

// The text of one token id, for logprobs (the server decodes it with the model's tokenizer).
using TokenText = std::function<std::string(std::int32_t)>;

// What every response and chunk of one request shares.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::chat;
  std::string id;          // "chatcmpl-..." / "cmpl-..."
  std::int64_t created = 0;  // unix seconds
  std::string model;
  bool logprobs = false;   // write logprobs (null otherwise)
};

// The whole non-streaming response.
std::string build_response(const ResponseMeta& meta, const std::vector<Choice>& choices,
                           const Usage& usage, const TokenText& token_text);

// One streaming chunk for choice `index`: `text` and its tokens' logprobs (chat: the first chunk
// of a choice carries role "assistant"); finish_reason "" for none. Returns the JSON only (the
// caller frames it as an SSE event).
std::string build_chunk(const ResponseMeta& meta, int index, std::string_view text,
                        const std::vector<TokenLogprob>& logprobs, std::string_view finish_reason,
                        bool first, const TokenText& token_text);

// The final usage chunk of stream_options.include_usage (empty choices).
std::string build_usage_chunk(const ResponseMeta& meta, const Usage& usage);

// GET /v1/models.
std::string build_models(const std::string& model, std::int64_t created);

// "data: <json>\n\n".
std::string sse_event(std::string_view json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace xserv::server
