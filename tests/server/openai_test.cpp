// xserv-server's wire format (examples/server/openai.cpp) without sockets or a model: request
// parsing and validation (every field, every error's status and param) and the response shapes
// the OpenAI SDKs read.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "openai.hpp"

namespace xserv::server {
namespace {

using json = nlohmann::json;

CompletionRequest chat(const std::string& body) { return parse_request(body, Endpoint::chat); }
CompletionRequest completion(const std::string& body) {
  return parse_request(body, Endpoint::completions);
}

// The ApiError a body raises (status 0 when it parses).
ApiError error_of(const std::string& body, Endpoint endpoint = Endpoint::chat) {
  try {
    parse_request(body, endpoint);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "");
}

const std::string kUser = R"("messages": [{"role": "user", "content": "hi"}])";

TEST_CASE("Server request parsing: defaults and every field", "[server]") {
  const CompletionRequest d = chat("{" + kUser + "}");
  CHECK(d.messages.size() == 1);
  CHECK(d.messages[0].role == "user");
  CHECK(d.messages[0].content == "hi");
  CHECK_FALSE(d.max_tokens.has_value());
  CHECK(d.temperature == 1.0f);
  CHECK(d.top_p == 1.0f);
  CHECK(d.n == 1);
  CHECK_FALSE(d.stream);
  CHECK_FALSE(d.logprobs);
  CHECK_FALSE(d.seed.has_value());

  const CompletionRequest r = chat(R"({"model": "m", "messages": [
      {"role": "developer", "content": "sys"},
      {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "user", "content": null}],
    "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "top_k": 5,
    "min_p": 0.1, "presence_penalty": -1, "frequency_penalty": 2, "repetition_penalty": 1.2,
    "seed": -1, "stop": ["x", "", "y"], "n": 3, "logprobs": true, "top_logprobs": 4,
    "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
    "chat_template_kwargs": {"enable_thinking": true}, "user": "ignored", "metadata": {}})");
  CHECK(r.model == "m");
  REQUIRE(r.messages.size() == 3);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].content == "ab");
  CHECK(r.messages[2].content.empty());
  CHECK(r.max_tokens == 7);
  CHECK(r.temperature == 0.0f);
  CHECK(r.top_p == 0.5f);
  CHECK(r.top_k == 5);
  CHECK(r.min_p == Approx(0.1));
  CHECK(r.presence_penalty == -1.0f);
  CHECK(r.frequency_penalty == 2.0f);
  CHECK(r.repetition_penalty == Approx(1.2));
  CHECK(r.seed == UINT64_MAX);
  CHECK(r.stop == std::vector<std::string>{"x", "y"});
  CHECK(r.n == 3);
  CHECK(r.logprobs);
  CHECK(r.top_logprobs == 4);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.ignore_eos);
  CHECK(r.enable_thinking);
}

TEST_CASE("Server request parsing: completions prompts", "[server]") {
  CHECK(completion(R"({"prompt": "ab"})").prompts.at(0).text == "ab");
  const CompletionRequest ids = completion(R"({"prompt": [1, 2, 3], "logprobs": 0})");
  REQUIRE(ids.prompts.size() == 1);
  CHECK(ids.prompts[0].is_tokens);
  CHECK(ids.prompts[0].tokens == std::vector<std::int32_t>{1, 2, 3});
  CHECK(ids.logprobs);
  CHECK(ids.top_logprobs == 0);
  const CompletionRequest many = completion(R"({"prompt": ["a", [4, 5]], "stop": "s"})");
  REQUIRE(many.prompts.size() == 2);
  CHECK_FALSE(many.prompts[0].is_tokens);
  CHECK(many.prompts[1].tokens.size() == 2);
  CHECK(many.stop == std::vector<std::string>{"s"});
  CHECK_FALSE(completion(R"({"prompt": "a"})").logprobs);
}

TEST_CASE("Server request parsing: errors name the field", "[server]") {
  struct Case {
    std::string body;
    std::string param;
    Endpoint endpoint;
  };
  const std::vector<Case> cases = {
      {"{", "", Endpoint::chat},
      {"[]", "", Endpoint::chat},
      {"{}", "messages", Endpoint::chat},
      {R"({"messages": []})", "messages", Endpoint::chat},
      {R"({"messages": [1]})", "messages[0]", Endpoint::chat},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].role", Endpoint::chat},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content", Endpoint::chat},
      {"{" + kUser + R"(, "model": 3})", "model", Endpoint::chat},
      {"{" + kUser + R"(, "temperature": "hot"})", "temperature", Endpoint::chat},
      {"{" + kUser + R"(, "temperature": 2.5})", "temperature", Endpoint::chat},
      {"{" + kUser + R"(, "top_p": 0})", "top_p", Endpoint::chat},
      {"{" + kUser + R"(, "max_tokens": 1.5})", "max_tokens", Endpoint::chat},
      {"{" + kUser + R"(, "max_tokens": 99999999999})", "max_tokens", Endpoint::chat},
      {"{" + kUser + R"(, "n": 17})", "n", Endpoint::chat},
      {"{" + kUser + R"(, "seed": "1"})", "seed", Endpoint::chat},
      {"{" + kUser + R"(, "seed": 18446744073709551615})", "seed", Endpoint::chat},
      {"{" + kUser + R"(, "stop": [1]})", "stop", Endpoint::chat},
      {"{" + kUser + R"(, "logprobs": 1})", "logprobs", Endpoint::chat},
      {"{" + kUser + R"(, "top_logprobs": 2})", "top_logprobs", Endpoint::chat},
      {"{" + kUser + R"(, "logprobs": true, "top_logprobs": 21})", "top_logprobs", Endpoint::chat},
      {"{" + kUser + R"(, "stream": "yes"})", "stream", Endpoint::chat},
      {"{" + kUser + R"(, "stream_options": 1})", "stream_options", Endpoint::chat},
      {"{" + kUser + R"(, "tools": [{}]})", "tools", Endpoint::chat},
      {"{" + kUser + R"(, "response_format": {"type": "json_object"}})", "response_format", Endpoint::chat},
      {"{" + kUser + R"(, "repetition_penalty": 0})", "repetition_penalty", Endpoint::chat},
      {R"({"prompt": 1})", "prompt", Endpoint::completions},
      {R"({"prompt": []})", "prompt", Endpoint::completions},
      {R"({"prompt": [-1]})", "prompt", Endpoint::completions},
      {R"({"prompt": [[]]})", "prompt", Endpoint::completions},
      {R"({"prompt": "a", "echo": true})", "echo", Endpoint::completions},
      {R"({"prompt": "a", "best_of": 2})", "best_of", Endpoint::completions},
      {R"({"prompt": "a", "logprobs": true})", "logprobs", Endpoint::completions},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    const ApiError e = error_of(c.body, c.endpoint);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == c.param);
    const json body = json::parse(error_body(e));
    CHECK(body["error"]["message"].get<std::string>().size() > 0);
    CHECK(body["error"].contains("code"));
  }
  CHECK(error_of("{").code == "invalid_json");
}

TEST_CASE("Server responses: chat and completions shapes", "[server]") {
  // (Appending rather than "t" + to_string: GCC 12 reports a false -Wrestrict on the latter.)
  const TokenText text_of = [](std::int32_t id) {
    std::string text = id == 7 ? "\xff" : "t";
    if (id != 7) text += std::to_string(id);
    return text;
  };
  ResponseMeta meta{Endpoint::chat, "chatcmpl-1", 42, "m", true};
  Choice c;
  c.text = "t1t2";
  c.finish_reason = "length";
  c.logprobs = {{1, -0.5f, {{1, -0.5f}, {3, -1.5f}}}, {2, -0.25f, {}}};
  const Usage usage{10, 8, 2};
  const json chat_body = json::parse(build_response(meta, {c}, usage, text_of));
  CHECK(chat_body["object"] == "chat.completion");
  CHECK(chat_body["created"] == 42);
  CHECK(chat_body["choices"][0]["message"]["content"] == "t1t2");
  CHECK(chat_body["choices"][0]["finish_reason"] == "length");
  CHECK(chat_body["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"] == "t3");
  CHECK(chat_body["choices"][0]["logprobs"]["content"][1]["bytes"] == json::array({116, 50}));
  CHECK(chat_body["usage"]["total_tokens"] == 12);
  CHECK(chat_body["usage"]["prompt_tokens_details"]["cached_tokens"] == 8);

  meta.endpoint = Endpoint::completions;
  const json text_body = json::parse(build_response(meta, {c}, usage, text_of));
  CHECK(text_body["object"] == "text_completion");
  CHECK(text_body["choices"][0]["text"] == "t1t2");
  CHECK(text_body["choices"][0]["logprobs"]["text_offset"] == json::array({0, 2}));
  CHECK(text_body["choices"][0]["logprobs"]["top_logprobs"][0]["t3"] == -1.5);

  // A token that is not valid UTF-8 on its own is replaced, never an exception.
  meta.endpoint = Endpoint::chat;
  const json odd = json::parse(build_chunk(meta, 0, "", {{7, -1.0f, {}}}, "", false, text_of));
  CHECK(odd["choices"][0]["logprobs"]["content"][0]["token"] == "\xEF\xBF\xBD");

  const json first = json::parse(build_chunk(meta, 2, "", {}, "", true, text_of));
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["index"] == 2);
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(build_chunk(meta, 0, "", {}, "stop", false, text_of));
  CHECK(last["choices"][0]["delta"].empty());
  CHECK(last["choices"][0]["finish_reason"] == "stop");
  const json u = json::parse(build_usage_chunk(meta, usage));
  CHECK(u["choices"].empty());
  CHECK(u["usage"]["completion_tokens"] == 2);
  CHECK(sse_event("{}") == "data: {}\n\n");
  CHECK(json::parse(build_models("m", 1))["data"][0]["id"] == "m");
}

TEST_CASE("Server plain chat rendering", "[server]") {
  CHECK(render_plain({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}) == "S\nU\nA\n");
}

}  // namespace
}  // namespace xserv::server
