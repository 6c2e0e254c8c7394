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

// Appends message text, noting its byte range.
struct Output {
  std::string text;
  std::vector<AddedTokenMatcher::Range>* content;

  Output& operator+=(std::string_view template_text) {
    text += template_text;
    return *this;
  }
  Output& operator+=(char c) {
    text += c;
    return *this;
  }
  void message(std::string_view s) {
    if (content != nullptr && !s.empty()) content->push_back({text.size(), text.size() + s.size()});
    text += s;
  }
};

void open_turn(Output& out, std::string_view role) {
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
                        bool add_generation_prompt, bool enable_thinking,
                        std::vector<AddedTokenMatcher::Range>* content_ranges) {
  XSERV_CHECK(tmpl.kind == ChatTemplate::Kind::chatml, ErrorCode::internal,
              "render_chat: no template");
  XSERV_CHECK(!msgs.empty(), ErrorCode::invalid_argument, "apply_chat_template: no messages");
  Output out{{}, content_ranges};
  const std::size_t n = msgs.size();
  if (msgs[0].role == "system") {
    open_turn(out, "system");
    out.message(msgs[0].content);
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
      out.message(m.content);
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      if (!tmpl.think_blocks) {
        open_turn(out, "assistant");
        out.message(content);
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
        out.message(rstrip_nl(lstrip_nl(reasoning)));
        out += "\n</think>\n\n";
        out.message(lstrip_nl(content));
      } else {
        out.message(content);
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out.message(m.content);
      out += "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // Other roles render nothing, as in the Qwen3 template.
  }
  if (add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (tmpl.thinking_switch && !enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return std::move(out.text);
}

}  // namespace xserv::tokenizer
