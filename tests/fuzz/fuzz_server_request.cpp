// libFuzzer target: xserv-server's request parsing (examples/server/openai.cpp) on arbitrary
// bytes. The first byte picks the endpoint (1: completions, anything else: chat), the rest is
// the body. Every input must either parse into a request whose fields are in range or raise
// ApiError with a 4xx status and a JSON error body; anything else (a crash, another exception, a sanitizer report,
// an out-of-range field) is a bug. A parsed request is also rendered back through the response
// builders, which must produce valid JSON.
//
// Built by the `fuzz` preset (tests/fuzz/CMakeLists.txt): scripts/fuzz.sh ci 20 server_request
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "openai.hpp"

using namespace xserv::server;

namespace {
void require(bool ok) {
  if (!ok) std::abort();
}

void check_ranges(const CompletionRequest& r) {
  require(r.n >= 1 && r.n <= kMaxN);
  require(r.temperature >= 0 && r.temperature <= 2);
  require(r.top_p > 0 && r.top_p <= 1);
  require(r.top_k >= 0);
  require(r.min_p >= 0 && r.min_p <= 1);
  require(r.repetition_penalty > 0);
  require(!r.max_tokens || *r.max_tokens >= 1);
  require(r.top_logprobs >= 0 && r.top_logprobs <= kMaxTopLogprobs);
  require(r.stop.size() <= static_cast<std::size_t>(kMaxStop));
  if (r.endpoint == Endpoint::chat) require(!r.messages.empty());
  else require(!r.prompts.empty() && r.prompts.size() <= static_cast<std::size_t>(kMaxPrompts));
  for (const Prompt& p : r.prompts)
    for (std::int32_t t : p.tokens) require(t >= 0);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] == 1 ? Endpoint::completions : Endpoint::chat;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const CompletionRequest r = parse_request(body, endpoint);
    check_ranges(r);
    ResponseMeta meta{endpoint, "id", 0, r.model, r.logprobs};
    Choice c;
    c.text = r.messages.empty() ? r.prompts[0].text : r.messages[0].content;  // any bytes
    c.finish_reason = "stop";
    c.logprobs = {{0, -1.0f, {{0, -1.0f}}}};
    const TokenText text_of = [&](std::int32_t) { return c.text; };
    require(nlohmann::json::accept(build_response(meta, {c}, Usage{}, text_of)));
    require(nlohmann::json::accept(build_chunk(meta, 0, c.text, c.logprobs, "", true, text_of)));
  } catch (const ApiError& e) {
    require(e.status >= 400 && e.status < 500);
    require(nlohmann::json::accept(error_body(e)));
  }
  return 0;
}
