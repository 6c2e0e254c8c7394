// xserv-cli chat: an interactive, multi-turn, streaming conversation.
//
// With a chat template (Qwen3) the whole history is rendered through the template each turn,
// exactly as transformers would, and the reply is streamed as it is sampled. Models without a
// template (GPT-2) get a plain running transcript that each input line extends and the model
// continues. When the history no longer fits the context, the oldest turns are dropped (the
// system prompt stays).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "engine/generate.hpp"
#include "models/model.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv::cli {
// Named (not only anonymous) so the command files can share one translation unit (unity builds).
namespace chat_cmd {
namespace {

constexpr const char* kUsage =
    "usage: xserv-cli chat -m DIR [options]\n"
    "\n"
    "Interactive chat: type a message, the reply streams back. The history is kept (through\n"
    "the model's chat template; a model without one continues a plain transcript).\n"
    "Commands: /reset forgets the history, /quit (or end of input) leaves.\n"
    "A line that is not valid UTF-8 (or too long for the context) is rejected with a message\n"
    "and the conversation goes on without it; the exit code is then 1.\n"
    "\n"
    "options:\n"
    "  -m, --model DIR        model directory (config.json, *.safetensors, tokenizer)\n"
    "  -n, --max-tokens N     reply length limit (default 256)\n"
    "  --temperature T        0 = greedy (default 0.7)\n"
    "  --top-k K              (default 40; 0 = off)\n"
    "  --top-p P              (default 0.95)\n"
    "  --min-p P              (default 0)\n"
    "  --repetition-penalty R (default 1.0)\n"
    "  --seed S               fixed seed (default: a fresh one per reply)\n"
    "  --system TEXT          system prompt (chat-template models)\n"
    "  --think                let Qwen3 think before answering (default: enable_thinking=false)\n"
    "  --device auto|cpu|cuda (default auto: cuda when a GPU is usable, else cpu)\n"
    "  --threads N            CPU threads (default: all)\n"
    "  --tp N                 split the model over N GPUs 0 .. N-1 (tensor parallelism)\n"
    "  --kv-cache-dtype D     auto (default: the backend's), f32 or bf16 (CPU: half the cache's\n"
    "                         memory and bytes; CUDA: only the weights' dtype)\n";

struct ChatOptions {
  std::string model_dir;
  SamplingParams sampling;
  std::string system;
  bool think = false;
  std::string device;
  std::size_t threads = 0;
  int tp = 1;
  std::optional<DType> kv_dtype;
};

std::string value_of(const Args& args, std::size_t& i) {
  XSERV_CHECK(i + 1 < args.size(), ErrorCode::invalid_argument, "{} needs a value", args[i]);
  return args[++i];
}

double number_of(const Args& args, std::size_t& i) {
  const std::string flag = args[i];
  const std::string v = value_of(args, i);
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  XSERV_CHECK(end != v.c_str() && *end == '\0', ErrorCode::invalid_argument,
              "{} takes a number, not '{}'", flag, v);
  return d;
}

ChatOptions parse(const Args& args) {
  ChatOptions o;
  o.sampling.max_tokens = 256;
  o.sampling.temperature = 0.7f;
  o.sampling.top_k = 40;
  o.sampling.top_p = 0.95f;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-m" || a == "--model") o.model_dir = value_of(args, i);
    else if (a == "-n" || a == "--max-tokens") o.sampling.max_tokens = static_cast<std::int32_t>(number_of(args, i));
    else if (a == "--temperature") o.sampling.temperature = static_cast<float>(number_of(args, i));
    else if (a == "--top-k") o.sampling.top_k = static_cast<std::int32_t>(number_of(args, i));
    else if (a == "--top-p") o.sampling.top_p = static_cast<float>(number_of(args, i));
    else if (a == "--min-p") o.sampling.min_p = static_cast<float>(number_of(args, i));
    else if (a == "--repetition-penalty") o.sampling.repetition_penalty = static_cast<float>(number_of(args, i));
    else if (a == "--seed") o.sampling.seed = static_cast<std::uint64_t>(number_of(args, i));
    else if (a == "--system") o.system = value_of(args, i);
    else if (a == "--think") o.think = true;
    else if (a == "--device") o.device = value_of(args, i);
    else if (a == "--threads") o.threads = static_cast<std::size_t>(number_of(args, i));
    else if (a == "--tp") o.tp = parse_number<int>(a, value_of(args, i));
    else if (a == "--kv-cache-dtype") o.kv_dtype = parse_kv_cache_dtype(value_of(args, i));
    else throw_error(ErrorCode::invalid_argument, "unknown option '{}' (see --help)", a);
  }
  XSERV_CHECK(!o.model_dir.empty(), ErrorCode::invalid_argument, "-m DIR is required");
  check_model_path(o.model_dir, ModelPath::directory);
  require_utf8(o.system, "--system");
  o.sampling.validate();
  return o;
}

// Streams a reply's text to stdout as it becomes safe to show.
TokenCallback print_text() {
  return [](const TokenEvent& e) {
    if (!e.text.empty()) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
}

class Chat {
 public:
  Chat(const ChatOptions& o, ModelGroup& group, const Tokenizer& tokenizer)
      : o_(o), tok_(tokenizer),
        engine_(group, &tokenizer, single_sequence_options(group.leader())),
        n_ctx_(group.leader().config().max_position_embeddings) {
    sampling_ = o.sampling;
    // ChatML ends a turn with <|im_end|>; stop there even if generation_config.json does not
    // list it among the eos ids.
    if (tok_.has_chat_template())
      if (auto id = tok_.token_id("<|im_end|>")) sampling_.stop_token_ids.push_back(*id);
    reset();
  }

  void reset() {
    history_.clear();
    transcript_.clear();
    if (tok_.has_chat_template() && !o_.system.empty()) history_.push_back({"system", o_.system});
  }

  // One user turn: the reply is streamed to stdout and kept in the history. A turn that fails
  // leaves the history as it was.
  void turn(const std::string& user) {
    const std::vector<Tokenizer::Message> history = history_;
    const std::string transcript = transcript_;
    try {
      if (tok_.has_chat_template()) turn_with_template(user);
      else turn_plain(user);
    } catch (...) {
      history_ = history;
      transcript_ = transcript;
      throw;
    }
  }

 private:
  // Room left for the prompt once the reply's tokens are reserved.
  std::size_t prompt_budget() const {
    const std::int64_t room = static_cast<std::int64_t>(n_ctx_) - sampling_.max_tokens;
    XSERV_CHECK(room > 0, ErrorCode::invalid_argument,
                "--max-tokens {} leaves no room for a prompt in the model's {} positions",
                sampling_.max_tokens, n_ctx_);
    return static_cast<std::size_t>(room);
  }

  void turn_with_template(const std::string& user) {
    history_.push_back({"user", user});
    std::vector<std::int32_t> ids = render();
    // Drop the oldest exchanges (never the system prompt nor this message) until it fits.
    const std::size_t first = !history_.empty() && history_.front().role == "system" ? 1 : 0;
    while (ids.size() > prompt_budget() && history_.size() > first + 1) {
      history_.erase(history_.begin() + static_cast<std::ptrdiff_t>(first));
      ids = render();
    }
    if (ids.size() > prompt_budget()) {
      history_.pop_back();
      throw_error(ErrorCode::invalid_argument,
                  "the message needs {} tokens; {} fit with a {}-token reply", ids.size(),
                  prompt_budget(), sampling_.max_tokens);
    }
    GenerationResult r;
    try {
      r = generate(engine_, ids, sampling_, print_text());
    } catch (...) {
      history_.pop_back();  // the turn did not happen
      throw;
    }
    std::fputc('\n', stdout);
    history_.push_back({"assistant", r.text});
  }

  std::vector<std::int32_t> render() const {
    return tok_.encode_chat(history_, true, o_.think);  // typed markers stay text
  }

  void turn_plain(const std::string& user) {
    transcript_ += user;
    transcript_ += '\n';
    std::vector<std::int32_t> ids = tok_.encode(transcript_, /*allow_special=*/false);
    if (ids.size() > prompt_budget()) {
      // Keep the most recent tokens and the text they decode to.
      ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(prompt_budget()));
      transcript_ = tok_.decode(ids);
    }
    const GenerationResult r = generate(engine_, ids, sampling_, print_text());
    std::fputc('\n', stdout);
    transcript_ += r.text;
    if (transcript_.empty() || transcript_.back() != '\n') transcript_ += '\n';
  }

  const ChatOptions& o_;
  const Tokenizer& tok_;
  Engine engine_;
  std::int32_t n_ctx_;
  SamplingParams sampling_;
  std::vector<Tokenizer::Message> history_;
  std::string transcript_;
};

}  // namespace
}  // namespace chat_cmd

int run_chat(const Args& args) {
  using namespace chat_cmd;
  for (const auto& a : args)
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  const ChatOptions o = parse(args);
  ModelOptions mo;
  mo.kv_dtype = o.kv_dtype;
  const std::unique_ptr<ModelGroup> group = load_model_group(o.model_dir, o.device, o.tp, o.threads, mo);
  Model* model = &group->leader();
  Backend* backend = &model->backend();
  const Tokenizer tokenizer = Tokenizer::load(o.model_dir);
  Chat chat(o, *group, tokenizer);

  const bool interactive = isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr, "%s: %s, %d layers, on %s\n", o.model_dir.c_str(),
               std::string(arch_name(model->config().arch)).c_str(), model->config().num_layers,
               backend->name().c_str());
  if (!tokenizer.has_chat_template())
    std::fprintf(stderr,
                 "this model has no chat template: plain continuation (each line you type is "
                 "added to a running transcript that the model continues)\n");
  if (interactive) std::fprintf(stderr, "/reset forgets the history, /quit leaves\n");

  std::string line;
  std::size_t line_number = 0, rejected = 0;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      chat.reset();
      continue;
    }
    try {
      require_utf8(line, fmt::format("line {}", line_number));
      chat.turn(line);
    } catch (const Error& e) {
      // A bad turn (too long, invalid UTF-8) is reported and leaves no trace in the history;
      // the conversation goes on, and the exit code says that a line was rejected.
      if (e.code() != ErrorCode::invalid_argument) throw;
      std::fprintf(stderr, "xserv-cli chat: %s; the line was ignored\n", e.what());
      ++rejected;
    }
  }
  if (interactive) std::fputc('\n', stdout);
  if (rejected > 0) {
    std::fprintf(stderr, "xserv-cli chat: %zu line(s) rejected\n", rejected);
    return 1;
  }
  return 0;
}

}  // namespace xserv::cli
