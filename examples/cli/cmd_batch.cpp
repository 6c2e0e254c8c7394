// xserv-cli batch: offline batch inference. JSONL requests on stdin, all submitted at once to
// one engine (they run as one continuous batch), one JSONL result per request on stdout in input
// order.
//
//   xserv-cli batch -m DIR [--device auto|cpu|cuda] [--kv-cache-tokens N] [--max-seqs N]
//                   [--max-batch-tokens N]
//       [--threads N] [--tp N] < requests.jsonl > results.jsonl
//
// A request line is an object with "prompt" (string) or "messages" (array of {role, content},
// rendered as `xserv-cli generate --chat` does: the model's chat template, or without one the
// contents joined by "\n"), and optionally max_tokens (default 128), temperature, top_p, top_k,
// min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stop (string or array).
// Sampling fields not given take generation_config.json's defaults, as in `generate`, so a
// request gives the text `xserv-cli generate` gives for the same prompt and options. Blank lines
// are skipped; "index" counts the other lines from 0.
//
// A result: {"index", "text", "ids", "finish_reason", "usage": {"prompt_tokens",
// "cached_tokens", "completion_tokens"}}. A line that is not a valid request (bad JSON, an
// unknown or mistyped field, absurd params, a prompt past the context) or whose generation
// fails gets {"index", "error"} instead; the others still run, and the exit code is then 1.
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"
#include "engine/generate.hpp"
#include "generation_config.hpp"
#include "models/model.hpp"
#include "progress.hpp"
#include "tokenizer/tokenizer.hpp"

namespace xserv::cli {

// Named (not only anonymous) so the command files can share one translation unit (unity builds).
namespace batch_cmd {
namespace {

using json = nlohmann::ordered_json;  // keeps the fields in the documented order

const char* kUsage = R"(usage: xserv-cli batch -m DIR [options] < requests.jsonl > results.jsonl

  -m, --model DIR            Hugging Face model directory (config.json, *.safetensors, tokenizer)
  --device auto|cpu|cuda     default auto: cuda when a GPU is usable, else cpu
  --kv-cache-tokens N        KV-cache pool size in tokens (default: the engine's)
  --max-seqs N               requests running at once (default 256)
  --max-batch-tokens N       tokens per engine step, prompt chunks and decodes (default 8192
                             on CUDA, 512 on the CPU)
  --threads N                CPU worker threads (default: all cores)
  --tp N                     split the model over N GPUs 0 .. N-1 (tensor parallelism over
                             NCCL; on the CPU N ranks of threads); default 1
  --kv-cache-dtype D         auto (default: the backend's), f32 or bf16 (CPU: half the
                             cache's memory and bytes; CUDA: only the weights' dtype)

Each stdin line: {"prompt": "..."} or {"messages": [{"role": "user", "content": "..."}]}, plus
optional max_tokens (default 128), temperature, top_p, top_k, min_p, repetition_penalty,
presence_penalty, frequency_penalty, seed, stop (string or array). Each stdout line, in input
order: {"index", "text", "ids", "finish_reason", "usage": {"prompt_tokens", "cached_tokens",
"completion_tokens"}}, or {"index", "error"} for a line that failed (exit code 1).
)";

struct Options {
  std::string model, device;
  std::int64_t kv_cache_tokens = 0;
  std::int32_t max_seqs = 256;
  std::int32_t max_batch_tokens = 0;  // 0: by device (run_batch)
  std::size_t threads = 0;
  int tp = 1;
  std::optional<DType> kv_dtype;
  bool help = false;
};

Options parse_options(const Args& args) {
  Options o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      XSERV_CHECK(i + 1 < args.size(), ErrorCode::invalid_argument, "{} needs a value", a);
      return args[++i];
    };
    if (a == "-m" || a == "--model") o.model = value();
    else if (a == "--device") o.device = value();
    else if (a == "--kv-cache-tokens") o.kv_cache_tokens = parse_number<std::int64_t>(a, value());
    else if (a == "--max-seqs") o.max_seqs = parse_number<std::int32_t>(a, value());
    else if (a == "--max-batch-tokens") o.max_batch_tokens = parse_number<std::int32_t>(a, value());
    else if (a == "--threads") o.threads = parse_number<std::size_t>(a, value());
    else if (a == "--tp") o.tp = parse_number<int>(a, value());
    else if (a == "--kv-cache-dtype") o.kv_dtype = parse_kv_cache_dtype(value());
    else if (a == "-h" || a == "--help") o.help = true;
    else throw_error(ErrorCode::invalid_argument, "unknown option '{}' (see xserv-cli batch --help)", a);
  }
  if (o.help) return o;
  XSERV_CHECK(!o.model.empty(), ErrorCode::invalid_argument, "-m DIR (the model directory) is required");
  XSERV_CHECK(o.max_seqs > 0, ErrorCode::invalid_argument, "--max-seqs must be at least 1");
  XSERV_CHECK(o.max_batch_tokens >= 0 && o.max_batch_tokens <= (1 << 20), ErrorCode::invalid_argument,
              "--max-batch-tokens takes 1 ..= {} (0: the device's default)", 1 << 20);
  XSERV_CHECK(o.kv_cache_tokens >= 0, ErrorCode::invalid_argument, "--kv-cache-tokens must not be negative");
  check_model_path(o.model, ModelPath::directory);
  return o;
}

// One input line: a request, or why it is not one; then what it produced.
struct Item {
  std::string error;  // non-empty: this line's result is {"index", "error"}
  std::vector<std::int32_t> prompt;
  SamplingParams params;
  std::string text;
  std::vector<std::int32_t> ids;
  FinishReason finish = FinishReason::none;
  std::int32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

float get_float(const json& req, const char* key) {
  const json& v = req.at(key);
  XSERV_CHECK(v.is_number(), ErrorCode::invalid_argument, "\"{}\" must be a number", key);
  return v.get<float>();
}

std::int64_t get_int(const json& req, const char* key) {
  const json& v = req.at(key);
  XSERV_CHECK(v.is_number_integer(), ErrorCode::invalid_argument, "\"{}\" must be an integer", key);
  return v.get<std::int64_t>();
}

std::string get_string(const json& v, const char* what) {
  XSERV_CHECK(v.is_string(), ErrorCode::invalid_argument, "{} must be a string", what);
  return v.get<std::string>();
}

// The prompt ids of a request: "prompt" (special-token text allowed, as `generate -p`), or
// "messages" rendered and encoded as `generate --chat` does (markers typed in a message stay
// text).
std::vector<std::int32_t> prompt_ids(const json& req, const Tokenizer& tok) {
  const bool has_prompt = req.contains("prompt"), has_messages = req.contains("messages");
  XSERV_CHECK(has_prompt != has_messages, ErrorCode::invalid_argument,
              "a request needs exactly one of \"prompt\" and \"messages\"");
  if (has_prompt) {
    const std::string text = get_string(req["prompt"], "\"prompt\"");
    require_utf8(text, "the prompt");
    return tok.encode(text);
  }
  const json& msgs = req["messages"];
  XSERV_CHECK(msgs.is_array() && !msgs.empty(), ErrorCode::invalid_argument,
              "\"messages\" must be a non-empty array of {{\"role\", \"content\"}}");
  std::vector<Tokenizer::Message> messages;
  for (const json& m : msgs) {
    XSERV_CHECK(m.is_object() && m.contains("role") && m.contains("content"),
                ErrorCode::invalid_argument, "each message must be an object with \"role\" and \"content\"");
    messages.push_back({get_string(m["role"], "a message's \"role\""),
                        get_string(m["content"], "a message's \"content\"")});
    require_utf8(messages.back().content, "a message's \"content\"");
  }
  return tok.encode_chat(messages, true);
}

// The sampling params of a request: its fields, generation_config.json for the others.
SamplingParams sampling_params(const json& req, const std::string& model_dir) {
  static const char* const kKnown[] = {"prompt", "messages", "max_tokens", "temperature", "top_p",
                                       "top_k", "min_p", "repetition_penalty", "presence_penalty",
                                       "frequency_penalty", "seed", "stop"};
  for (const auto& [key, _] : req.items()) {
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    XSERV_CHECK(known, ErrorCode::invalid_argument, "unknown field \"{}\"", key);
  }
  SamplingParams p;
  GivenSampling given;
  p.max_tokens = 128;  // as `xserv-cli generate`
  if (req.contains("max_tokens")) {
    const std::int64_t n = get_int(req, "max_tokens");
    XSERV_CHECK(n >= 0 && n <= INT32_MAX, ErrorCode::invalid_argument, "\"max_tokens\" must be in [0, 2^31)");
    p.max_tokens = static_cast<std::int32_t>(n);
  }
  if ((given.temperature = req.contains("temperature"))) p.temperature = get_float(req, "temperature");
  if ((given.top_p = req.contains("top_p"))) p.top_p = get_float(req, "top_p");
  if ((given.min_p = req.contains("min_p"))) p.min_p = get_float(req, "min_p");
  if ((given.repetition_penalty = req.contains("repetition_penalty")))
    p.repetition_penalty = get_float(req, "repetition_penalty");
  if ((given.top_k = req.contains("top_k"))) {
    const std::int64_t k = get_int(req, "top_k");
    XSERV_CHECK(k >= 0 && k <= INT32_MAX, ErrorCode::invalid_argument, "\"top_k\" must be in [0, 2^31)");
    p.top_k = static_cast<std::int32_t>(k);
  }
  if (req.contains("presence_penalty")) p.presence_penalty = get_float(req, "presence_penalty");
  if (req.contains("frequency_penalty")) p.frequency_penalty = get_float(req, "frequency_penalty");
  if (req.contains("seed")) {
    XSERV_CHECK(req["seed"].is_number_unsigned(), ErrorCode::invalid_argument,
                "\"seed\" must be a non-negative integer");
    p.seed = req["seed"].get<std::uint64_t>();
  }
  if (req.contains("stop")) {
    const json& stop = req["stop"];
    if (stop.is_string()) p.stop_strings.push_back(stop.get<std::string>());
    else {
      XSERV_CHECK(stop.is_array(), ErrorCode::invalid_argument, "\"stop\" must be a string or an array of strings");
      for (const json& s : stop) p.stop_strings.push_back(get_string(s, "each \"stop\" entry"));
    }
  }
  apply_generation_config(model_dir, given, p);
  p.validate();
  return p;
}

// Parses one line into item (prompt ids and params), or sets item.error.
void parse_line(const std::string& line, const Tokenizer& tok, const Model& model,
                const std::string& model_dir, Item& item) {
  try {
    const json req = json::parse(line);
    XSERV_CHECK(req.is_object(), ErrorCode::invalid_argument, "a request must be a JSON object");
    item.params = sampling_params(req, model_dir);
    item.prompt = prompt_ids(req, tok);
    if (item.prompt.empty() && model.config().bos_token_id) item.prompt.push_back(*model.config().bos_token_id);
    XSERV_CHECK(!item.prompt.empty(), ErrorCode::invalid_argument, "the prompt is empty");
  } catch (const json::exception& e) {
    item.error = std::string("not a JSON request: ") + e.what();
  } catch (const Error& e) {
    item.error = e.what();
  }
}

// Submits every parsed request, steps the engine until all have ended, collecting events.
void run_all(Engine& engine, std::vector<Item>& items) {
  std::map<RequestId, std::size_t> index;
  std::size_t open = 0, done = 0, total = 0;
  for (const Item& it : items) total += it.error.empty() ? 1 : 0;
  auto progress = count_progress_bar("batch");  // empty unless stderr is a terminal
  auto on_event = [&](const EngineEvent& e) {
    Item& it = items[index.at(e.request)];
    if (e.type == EventType::token) it.ids.push_back(e.token);
    it.text += e.text;
    if (e.finish == FinishReason::none) return;
    it.finish = e.finish;
    it.prompt_tokens = e.prompt_tokens;
    it.cached_tokens = e.cached_tokens;
    it.completion_tokens = e.completion_tokens;
    if (e.status != ErrorCode::ok) it.error = e.error.empty() ? std::string(to_string(e.status)) : e.error;
    --open;
    if (progress) progress(++done, total);
  };
  for (std::size_t i = 0; i < items.size(); ++i) {  // all submitted before the first step
    if (!items[i].error.empty()) continue;
    EngineRequest req;
    req.prompt = items[i].prompt;
    req.params = items[i].params;
    req.on_event = on_event;
    try {
      index[engine.submit(std::move(req))] = i;
      ++open;
    } catch (const Error& e) {  // e.g. a prompt past the model's context
      items[i].error = e.what();
      --total;
    }
  }
  if (progress) progress(0, total);
  while (open > 0) {
    try {
      engine.step();
    } catch (const Error& e) {  // the forward failed: whatever has not ended fails with it
      for (const auto& [id, i] : index)
        if (items[i].finish == FinishReason::none && items[i].error.empty()) items[i].error = e.what();
      return;
    }
  }
}

json result_json(std::size_t i, const Item& it) {
  if (!it.error.empty()) return json{{"index", i}, {"error", it.error}};
  return json{{"index", i},
              {"text", it.text},
              {"ids", it.ids},
              {"finish_reason", std::string(finish_reason_name(it.finish))},
              {"usage",
               {{"prompt_tokens", it.prompt_tokens},
                {"cached_tokens", it.cached_tokens},
                {"completion_tokens", it.completion_tokens}}}};
}

}  // namespace
}  // namespace batch_cmd

int run_batch(const Args& args) {
  using namespace batch_cmd;
  const Options o = parse_options(args);
  if (o.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const Tokenizer tok = Tokenizer::load(o.model);
  // Offline batches live on throughput: on a GPU, 8192-token steps take many prompts in one
  // forward (as xserv-server's default); the CPU keeps the library's 512. The model's workspace
  // is sized for the step.
  ModelOptions mo;
  mo.kv_dtype = o.kv_dtype;
  if (o.max_batch_tokens > 0) mo.max_batch_tokens = o.max_batch_tokens;
  else if (pick_device(o.device) == DeviceKind::cuda) mo.max_batch_tokens = 8192;
  auto group = load_model_group(o.model, o.device, o.tp, o.threads, mo);
  Model* model = &group->leader();

  std::vector<Item> items;
  for (std::string line; std::getline(std::cin, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank: no request
    parse_line(line, tok, *model, o.model, items.emplace_back());
  }

  EngineOptions eo;
  eo.max_seqs = o.max_seqs;
  eo.kv_cache_tokens = o.kv_cache_tokens;
  eo.max_batch_tokens = mo.max_batch_tokens;
  Engine engine(*group, &tok, eo);
  run_all(engine, items);

  bool failed = false;
  for (std::size_t i = 0; i < items.size(); ++i) {
    failed = failed || !items[i].error.empty();
    const std::string out = result_json(i, items[i]).dump(-1, ' ', false, json::error_handler_t::replace);
    std::printf("%s\n", out.c_str());
  }
  std::fflush(stdout);
  return failed ? 1 : 0;
}

}  // namespace xserv::cli
