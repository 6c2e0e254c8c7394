// xserv-cli generate: text in, text out, streamed to stdout as it is produced.
//
//   xserv-cli generate -m DIR -p PROMPT [-n N] [--temperature T] [--top-k K] [--top-p P]
//       [--min-p P] [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
//       [--seed S] [--stop STR]... [--ignore-eos] [--chat] [--no-thinking] [--ids]
//       [--device auto|cpu|cuda] [--threads N] [--tp N] [--dummy-weights] [--quiet]
//
// Sampling defaults come from the model's generation_config.json when it has them (as
// transformers does), else temperature 1 and no truncation; --temperature 0 is greedy. Only the
// generated text goes to stdout (plus, with --ids, the generated ids as one JSON array on the
// last line); a summary (tokens, speed, finish reason) goes to stderr unless --quiet.
#include <cstdio>
#include <string>

#include "backend/backend.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "engine/generate.hpp"
#include "generation_config.hpp"
#include "models/model.hpp"
#include "models/model_group.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv::cli {

// Named (not only anonymous) so the command files can share one translation unit (unity builds).
namespace generate_cmd {
namespace {

const char* kUsage = R"(usage: xserv-cli generate -m DIR -p PROMPT [options]

  -m, --model DIR            Hugging Face model directory (config.json, *.safetensors, tokenizer)
  -p, --prompt TEXT          the prompt (empty: start from the model's bos token)
  -n, --max-tokens N         tokens to generate at most (default 128)
  --temperature T            0 = greedy (default: generation_config.json, else 1)
  --top-k K                  keep the K most likely tokens (0 = off)
  --top-p P                  nucleus sampling: smallest set with probability >= P (1 = off)
  --min-p P                  drop tokens below P x the top probability (0 = off)
  --repetition-penalty R     HF repetition penalty over prompt and output (1 = off)
  --presence-penalty P       OpenAI presence penalty over the output (0 = off)
  --frequency-penalty F      OpenAI frequency penalty over the output (0 = off)
  --seed S                   random seed (default: a fresh one each run)
  --stop STR                 stop before this text (not printed); repeatable
  --ignore-eos               keep generating past the model's end-of-sequence tokens
  --chat                     wrap the prompt as a user message in the chat template
  --no-thinking              with --chat: Qwen3's enable_thinking=false (empty think block)
  --ids                      also print the generated ids as a JSON array on the last line
  --device auto|cpu|cuda     default auto: cuda when a GPU is usable, else cpu
  --threads N                CPU worker threads (default: all cores)
  --tp N                     split the model over N GPUs 0 .. N-1 (tensor parallelism over
                             NCCL; on the CPU N ranks of threads); default 1
  --kv-cache-dtype D         auto (default: the backend's), f32 or bf16 (CPU: half the
                             cache's memory and bytes; CUDA: only the weights' dtype)
  --dummy-weights            random weights from config.json (speed checks without files)
  --quiet                    no summary on stderr
)";

struct Options {
  std::string model, prompt;
  SamplingParams params;
  GivenSampling given;  // sampling flags given (generation_config.json fills the others)
  bool chat = false, thinking = true, ids = false, dummy = false, quiet = false, help = false;
  std::string device;
  std::size_t threads = 0;
  int tp = 1;
  std::optional<DType> kv_dtype;
};

Options parse_options(const Args& args) {
  Options o;
  o.params.max_tokens = 128;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      XSERV_CHECK(i + 1 < args.size(), ErrorCode::invalid_argument, "{} needs a value", a);
      return args[++i];
    };
    if (a == "-m" || a == "--model") o.model = value();
    else if (a == "-p" || a == "--prompt") o.prompt = value();
    else if (a == "-n" || a == "--max-tokens") o.params.max_tokens = parse_number<std::int32_t>(a, value());
    else if (a == "--temperature") { o.params.temperature = parse_number<float>(a, value()); o.given.temperature = true; }
    else if (a == "--top-k") { o.params.top_k = parse_number<std::int32_t>(a, value()); o.given.top_k = true; }
    else if (a == "--top-p") { o.params.top_p = parse_number<float>(a, value()); o.given.top_p = true; }
    else if (a == "--min-p") { o.params.min_p = parse_number<float>(a, value()); o.given.min_p = true; }
    else if (a == "--repetition-penalty") { o.params.repetition_penalty = parse_number<float>(a, value()); o.given.repetition_penalty = true; }
    else if (a == "--presence-penalty") o.params.presence_penalty = parse_number<float>(a, value());
    else if (a == "--frequency-penalty") o.params.frequency_penalty = parse_number<float>(a, value());
    else if (a == "--seed") o.params.seed = parse_number<std::uint64_t>(a, value());
    else if (a == "--stop") {
      o.params.stop_strings.push_back(value());
      require_utf8(o.params.stop_strings.back(), "--stop");
    }
    else if (a == "--ignore-eos") o.params.ignore_eos = true;
    else if (a == "--chat") o.chat = true;
    else if (a == "--no-thinking") o.thinking = false;
    else if (a == "--ids") o.ids = true;
    else if (a == "--device") o.device = value();
    else if (a == "--threads") o.threads = parse_number<std::size_t>(a, value());
    else if (a == "--tp") o.tp = parse_number<int>(a, value());
    else if (a == "--kv-cache-dtype") o.kv_dtype = parse_kv_cache_dtype(value());
    else if (a == "--dummy-weights") o.dummy = true;
    else if (a == "--quiet") o.quiet = true;
    else if (a == "-h" || a == "--help") o.help = true;
    else throw_error(ErrorCode::invalid_argument, "unknown option '{}' (see xserv-cli generate --help)", a);
  }
  if (o.help) return o;
  XSERV_CHECK(!o.model.empty(), ErrorCode::invalid_argument, "-m DIR (the model directory) is required");
  check_model_path(o.model, ModelPath::directory);
  require_utf8(o.prompt, "the prompt (-p)");
  return o;
}

}  // namespace
}  // namespace generate_cmd

int run_generate(const Args& args) {
  using namespace generate_cmd;
  Options o = parse_options(args);
  if (o.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  apply_generation_config(o.model, o.given, o.params);
  o.params.validate();

  const Tokenizer tok = Tokenizer::load(o.model);
  ModelOptions mo;
  mo.dummy_weights = o.dummy;
  mo.kv_dtype = o.kv_dtype;
  auto group = load_model_group(o.model, o.device, o.tp, o.threads, mo);
  Model* model = &group->leader();
  Backend* backend = &model->backend();

  std::vector<std::int32_t> prompt;
  if (o.chat) {
    const Tokenizer::Message msg{"user", o.prompt};
    prompt = tok.encode_chat(std::span<const Tokenizer::Message>(&msg, 1), true, o.thinking);
  } else {
    prompt = tok.encode(o.prompt);  // the operator's own text: special-token text allowed
  }
  if (prompt.empty() && model->config().bos_token_id) prompt.push_back(*model->config().bos_token_id);

  Engine engine(*group, &tok, single_sequence_options(*model));
  GenerationStats s;
  GenerationResult r = generate(engine, prompt, o.params, [](const TokenEvent& e) {
    if (!e.text.empty()) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  }, &s);
  if (o.ids) {
    std::string line = r.text.empty() || r.text.back() == '\n' ? "[" : "\n[";
    for (std::size_t i = 0; i < r.tokens.size(); ++i) line += fmt::format("{}{}", i ? ", " : "", r.tokens[i]);
    std::printf("%s]\n", line.c_str());
  } else if (!r.text.empty() && r.text.back() != '\n') {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (!o.quiet) {
    auto rate = [](double n, double t) { return t > 0 ? n / t : 0.0; };
    std::fprintf(stderr,
                 "[%s on %s: %d prompt tokens (%.1f tok/s), %zu generated (%.1f tok/s), finish: %s]\n",
                 model->config().model_type.c_str(), backend->name().c_str(), r.prompt_tokens,
                 rate(static_cast<double>(s.prefill_tokens), s.prefill_seconds), r.tokens.size(),
                 rate(static_cast<double>(s.decode_tokens), s.decode_seconds),
                 std::string(finish_reason_name(r.finish)).c_str());
  }
  return 0;
}

}  // namespace xserv::cli
