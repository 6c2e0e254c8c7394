#include "tokenizer/chat_template.hpp"

#include <optional>

#include "core/error.hpp"

namespace xserv::tokenizer {

namespace {

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

// Python's str.lstrip/rstrip/strip with a set of characters, here only '\n'.
std::string_view lstrip_nl(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_nl(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  auto p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  auto p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

bool is_tool_response(std::string_view s) {
  return s.starts_with("<tool_response>") && s.ends_with("</tool_response>");
}

void open_turn(std::string& out, std::string_view role) {
  out += "<|im_start|>";
  out += role;
  out += '\n';
}

}  // namespace

ChatTemplate ChatTemplate::detect(std::string_view source) {
  ChatTemplate t;
  if (!contains(source, "<|im_start|>") || !contains(source, "<|im_end|>")) return t;
  t.kind = Kind::chatml;
  t.think_blocks = contains(source, "</think>") && contains(source, "reasoning_content");
  t.thinking_switch = contains(source, "enable_thinking");
  return t;
}

std::string render_chat(const ChatTemplate& tmpl, std::span<const Tokenizer::Message> msgs,
                        bool add_generation_prompt, bool enable_thinking) {
  XSERV_CHECK(tmpl.kind == ChatTemplate::Kind::chatml, ErrorCode::internal,
              "render_chat: no template");
  XSERV_CHECK(!msgs.empty(), ErrorCode::invalid_argument, "apply_chat_template: no messages");
  std::string out;
  const std::size_t n = msgs.size();
  if (msgs[0].role == "system") {
    open_turn(out, "system");
    out += msgs[0].content;
    out += "<|im_end|>\n";
  }
  // The last user turn that is a real query (not a tool result handed back as user text):
  // reasoning is kept only for assistant turns after it.
  std::size_t last_query = n - 1;
  if (tmpl.think_blocks) {
    for (std::size_t k = n; k-- > 0;) {
      if (msgs[k].role == "user" && !is_tool_response(msgs[k].content)) {
        last_query = k;
        break;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      open_turn(out, m.role);
      out += m.content;
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      if (!tmpl.think_blocks) {
        open_turn(out, "assistant");
        out += content;
        out += "<|im_end|>\n";
        continue;
      }
      std::string_view reasoning;
      if (contains(content, "</think>")) {
        std::string_view full = m.content;
        content = lstrip_nl(after_last(full, "</think>"));
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(full, "</think>")), "<think>"));
      }
      open_turn(out, "assistant");
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out += "<think>\n";
        out += rstrip_nl(lstrip_nl(reasoning));
        out += "\n</think>\n\n";
        out += lstrip_nl(content);
      } else {
        out += content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += m.content;
      out += "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // Other roles render nothing, as in the Qwen3 template.
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (tmpl.thinking_switch && !enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

}  // namespace xserv::tokenizer
