// openai.cpp — see openai.hpp. JSON through nlohmann::json (Debian nlohmann-json3-dev): it both
// reads and writes, parses without recursion (deeply nested bodies cannot overflow the stack)
// and reports a parse error without throwing, so a bad body is a 400, never a crash.
#include "openai.hpp"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace xserv::server {
namespace {

using json = nlohmann::json;

json null_or(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

// The value of `key`, or nullptr when it is absent or JSON null (both mean "not given").
const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

ApiError wrong_type(const char* key, const char* what) {
  return invalid_request(std::string("'") + key + "' must be " + what, key);
}

std::optional<double> number_field(const json& obj, const char* key, double lo, double hi) {
  const json* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) throw wrong_type(key, "a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    throw invalid_request(std::string("'") + key + "' must be in [" + json(lo).dump() + ", " +
                              json(hi).dump() + "], not " + v->dump(),
                          key);
  return d;
}

// An integer (a float with an integral value is accepted, as JSON does not tell them apart).
std::optional<std::int64_t> int_field(const json& obj, const char* key, std::int64_t lo,
                                      std::int64_t hi) {
  const json* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  std::int64_t i = 0;
  if (v->is_number_integer() && !(v->is_number_unsigned() &&
                                  v->get<std::uint64_t>() > std::uint64_t(INT64_MAX))) {
    i = v->get<std::int64_t>();
  } else if (v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    i = static_cast<std::int64_t>(v->get<double>());
  } else {
    throw wrong_type(key, "an integer");
  }
  if (i < lo || i > hi)
    throw invalid_request(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "], not " + std::to_string(i),
                          key);
  return i;
}

std::optional<bool> bool_field(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) throw wrong_type(key, "a boolean");
  return v->get<bool>();
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts (joined).
std::string content_of(const json& message, std::size_t i) {
  const std::string param = "messages[" + std::to_string(i) + "].content";
  const json* c = field(message, "content");
  if (c == nullptr) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) throw invalid_request("'" + param + "' must be a string or a list of parts", param);
  std::string text;
  for (const json& part : *c) {
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text")
      throw invalid_request("only text content parts are supported in '" + param + "'", param);
    const json* t = field(part, "text");
    if (t == nullptr || !t->is_string())
      throw invalid_request("a text part of '" + param + "' needs a string 'text'", param);
    text += t->get<std::string>();
  }
  return text;
}

std::vector<Message> parse_messages(const json& body) {
  const json* m = field(body, "messages");
  if (m == nullptr) throw invalid_request("'messages' is required", "messages");
  if (!m->is_array()) throw wrong_type("messages", "a list of messages");
  if (m->empty()) throw invalid_request("'messages' must not be empty", "messages");
  std::vector<Message> out;
  for (std::size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) throw invalid_request("'" + param + "' must be an object", param);
    const json* role = field(msg, "role");
    if (role == nullptr || !role->is_string())
      throw invalid_request("'" + param + ".role' must be a string", param + ".role");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant")
      throw invalid_request("role '" + r + "' is not supported (system, developer, user, assistant)",
                            param + ".role");
    out.push_back({r, content_of(msg, i)});
  }
  return out;
}

// A token-id prompt: a list of integers within int32.
Prompt token_prompt(const json& list, const std::string& param) {
  Prompt p;
  p.is_tokens = true;
  for (const json& t : list) {
    if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
        t.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max() ||
        (t.is_number_unsigned() && t.get<std::uint64_t>() > std::uint64_t(INT32_MAX)))
      throw invalid_request("'" + param + "' token ids must be non-negative integers", param);
    p.tokens.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
  }
  if (p.tokens.empty()) throw invalid_request("'" + param + "' must not be empty", param);
  return p;
}

// `prompt`: a string, a list of strings, a list of ids, or a list of lists of ids.
std::vector<Prompt> parse_prompts(const json& body) {
  const json* p = field(body, "prompt");
  if (p == nullptr) throw invalid_request("'prompt' is required", "prompt");
  const char* what = "a string, a list of strings, a list of token ids or a list of such lists";
  if (p->is_string()) return {Prompt{p->get<std::string>(), {}, false}};
  if (!p->is_array()) throw wrong_type("prompt", what);
  if (p->empty()) throw invalid_request("'prompt' must not be empty", "prompt");
  if ((*p)[0].is_number()) return {token_prompt(*p, "prompt")};
  if (p->size() > static_cast<std::size_t>(kMaxPrompts))
    throw invalid_request("at most " + std::to_string(kMaxPrompts) + " prompts per request", "prompt");
  std::vector<Prompt> out;
  for (const json& item : *p) {
    if (item.is_string()) out.push_back({item.get<std::string>(), {}, false});
    else if (item.is_array()) out.push_back(token_prompt(item, "prompt"));
    else throw wrong_type("prompt", what);
  }
  return out;
}

std::vector<std::string> parse_stop(const json& body) {
  const json* s = field(body, "stop");
  if (s == nullptr) return {};
  if (s->is_string()) return s->get<std::string>().empty() ? std::vector<std::string>{}
                                                           : std::vector<std::string>{s->get<std::string>()};
  if (!s->is_array()) throw wrong_type("stop", "a string or a list of strings");
  if (s->size() > static_cast<std::size_t>(kMaxStop))
    throw invalid_request("at most " + std::to_string(kMaxStop) + " stop strings", "stop");
  std::vector<std::string> out;
  for (const json& item : *s) {
    if (!item.is_string()) throw wrong_type("stop", "a string or a list of strings");
    if (!item.get<std::string>().empty()) out.push_back(item.get<std::string>());
  }
  return out;
}

// Fields that would change the answer's meaning and that xserv does not implement: refused
// rather than silently ignored. Unknown fields (user, metadata, store, ...) are ignored.
void refuse_unsupported(const json& body) {
  for (const char* key : {"tools", "functions", "logit_bias"}) {
    const json* v = field(body, key);
    if (v != nullptr && !v->empty()) throw invalid_request(std::string("'") + key + "' is not supported", key);
  }
  if (const json* rf = field(body, "response_format")) {
    const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (type == nullptr || *type != "text")
      throw invalid_request("only response_format {\"type\": \"text\"} is supported", "response_format");
  }
  if (bool_field(body, "echo").value_or(false)) throw invalid_request("'echo' is not supported", "echo");
  if (int_field(body, "best_of", 0, 1 << 20).value_or(1) > 1)
    throw invalid_request("'best_of' is not supported", "best_of");
  if (const json* suffix = field(body, "suffix"); suffix != nullptr && *suffix != "")
    throw invalid_request("'suffix' is not supported", "suffix");
}

void parse_sampling(const json& body, CompletionRequest& r) {
  // max_completion_tokens (chat's current name) wins over the deprecated max_tokens.
  std::optional<std::int64_t> max = int_field(body, "max_completion_tokens", 1, INT32_MAX);
  if (!max) max = int_field(body, "max_tokens", 1, INT32_MAX);
  if (max) r.max_tokens = static_cast<int>(*max);
  r.temperature = static_cast<float>(number_field(body, "temperature", 0, 2).value_or(1));
  r.top_p = static_cast<float>(number_field(body, "top_p", 0, 1).value_or(1));
  if (r.top_p <= 0) throw invalid_request("'top_p' must be in (0, 1]", "top_p");
  r.top_k = static_cast<int>(int_field(body, "top_k", -1, INT32_MAX).value_or(0));
  if (r.top_k < 0) r.top_k = 0;  // vLLM's -1 means off too
  r.min_p = static_cast<float>(number_field(body, "min_p", 0, 1).value_or(0));
  r.presence_penalty = static_cast<float>(number_field(body, "presence_penalty", -2, 2).value_or(0));
  r.frequency_penalty = static_cast<float>(number_field(body, "frequency_penalty", -2, 2).value_or(0));
  r.repetition_penalty =
      static_cast<float>(number_field(body, "repetition_penalty", 0, 10).value_or(1));
  if (r.repetition_penalty <= 0)
    throw invalid_request("'repetition_penalty' must be in (0, 10]", "repetition_penalty");
  if (auto seed = int_field(body, "seed", INT64_MIN, INT64_MAX))
    r.seed = static_cast<std::uint64_t>(*seed);
  r.stop = parse_stop(body);
  r.ignore_eos = bool_field(body, "ignore_eos").value_or(false);
  r.n = static_cast<int>(int_field(body, "n", 1, kMaxN).value_or(1));
}

void parse_logprobs(const json& body, CompletionRequest& r) {
  if (r.endpoint == Endpoint::chat) {
    r.logprobs = bool_field(body, "logprobs").value_or(false);
    const auto top = int_field(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top && !r.logprobs && *top > 0)
      throw invalid_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    r.top_logprobs = static_cast<int>(top.value_or(0));
  } else {
    // Legacy completions: logprobs is the number of alternatives (0 still returns the sampled
    // tokens' own log-probabilities).
    const auto top = int_field(body, "logprobs", 0, kMaxTopLogprobs);
    r.logprobs = top.has_value();
    r.top_logprobs = static_cast<int>(top.value_or(0));
  }
}

void parse_stream(const json& body, CompletionRequest& r) {
  r.stream = bool_field(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw wrong_type("stream_options", "an object");
    r.include_usage = bool_field(*so, "include_usage").value_or(false);
  }
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

// Token text as JSON: invalid UTF-8 (a token that splits a character) is replaced, never thrown.
json text_json(const std::string& s) {
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace));
}

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs(const std::vector<TokenLogprob>& lps, const TokenText& token_text) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(lp.token);
    json top = json::array();
    for (const auto& [id, l] : lp.top) {
      const std::string tt = token_text(id);
      top.push_back({{"token", text_json(tt)}, {"logprob", l}, {"bytes", bytes_json(tt)}});
    }
    content.push_back({{"token", text_json(t)}, {"logprob", lp.logprob}, {"bytes", bytes_json(t)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Legacy completions logprobs: parallel lists, offsets into the choice's text starting at
// `offset` (the text already sent for this choice when streaming).
json completion_logprobs(const std::vector<TokenLogprob>& lps, const TokenText& token_text,
                         std::size_t offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(lp.token);
    tokens.push_back(text_json(t));
    token_logprobs.push_back(lp.logprob);
    json alternatives = json::object();
    for (const auto& [id, l] : lp.top) alternatives[text_json(token_text(id)).get<std::string>()] = l;
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
          {"text_offset", offsets}};
}

json base(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json finish_json(std::string_view reason) {
  return reason.empty() ? json(nullptr) : json(std::string(reason));
}

}  // namespace

ApiError invalid_request(std::string message, std::string param, std::string code) {
  return ApiError(400, "invalid_request_error", std::move(message), std::move(param), std::move(code));
}

std::string error_body(const ApiError& e) {
  return dump({{"error",
                {{"message", e.what()}, {"type", e.type}, {"param", null_or(e.param)},
                 {"code", null_or(e.code)}}}});
}

CompletionRequest parse_request(std::string_view body_text, Endpoint endpoint) {
  const json body = json::parse(body_text.begin(), body_text.end(), nullptr, false);
  if (body.is_discarded())
    throw invalid_request("the request body is not valid JSON", "", "invalid_json");
  if (!body.is_object()) throw invalid_request("the request body must be a JSON object");
  CompletionRequest r;
  r.endpoint = endpoint;
  if (const json* model = field(body, "model")) {
    if (!model->is_string()) throw wrong_type("model", "a string");
    r.model = model->get<std::string>();
  }
  if (endpoint == Endpoint::chat) r.messages = parse_messages(body);
  else r.prompts = parse_prompts(body);
  refuse_unsupported(body);
  parse_sampling(body, r);
  parse_logprobs(body, r);
  parse_stream(body, r);
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object");
    r.enable_thinking = bool_field(*kw, "enable_thinking").value_or(false);
  }
  return r;
}

std::string render_plain(const std::vector<Message>& messages) {
  std::string text;
  for (const Message& m : messages) {
    text += m.content;
    text += '\n';
  }
  return text;
}

std::string build_response(const ResponseMeta& meta, const std::vector<Choice>& choices,
                           const Usage& usage, const TokenText& token_text) {
  const bool chat = meta.endpoint == Endpoint::chat;
  json j = base(meta, chat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", finish_json(c.finish_reason)}};
    json lp = nullptr;
    if (meta.logprobs)
      lp = chat ? chat_logprobs(c.logprobs, token_text) : completion_logprobs(c.logprobs, token_text, 0);
    choice["logprobs"] = lp;
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    else choice["text"] = c.text;
    list.push_back(std::move(choice));
  }
  j["choices"] = std::move(list);
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string build_chunk(const ResponseMeta& meta, int index, std::string_view text,
                        const std::vector<TokenLogprob>& logprobs, std::string_view finish_reason,
                        bool first, const TokenText& token_text) {
  const bool chat = meta.endpoint == Endpoint::chat;
  json j = base(meta, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", index}, {"finish_reason", finish_json(finish_reason)}};
  json lp = nullptr;
  if (meta.logprobs && !logprobs.empty())
    lp = chat ? chat_logprobs(logprobs, token_text) : completion_logprobs(logprobs, token_text, 0);
  choice["logprobs"] = lp;
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = std::string(text);
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = std::string(text);
  }
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = nullptr;
  return dump(j);
}

std::string build_usage_chunk(const ResponseMeta& meta, const Usage& usage) {
  json j = base(meta, meta.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return dump(j);
}

std::string build_models(const std::string& model, std::int64_t created) {
  return dump({{"object", "list"},
               {"data", json::array({{{"id", model}, {"object", "model"}, {"created", created},
                                      {"owned_by", "xserv"}}})}});
}

std::string sse_event(std::string_view json_text) {
  std::string out = "data: ";
  out.append(json_text);
  out += "\n\n";
  return out;
}

}  // namespace xserv::server
