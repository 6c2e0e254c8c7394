// xserv-server — an OpenAI-compatible HTTP server and a chat page over the xserv engine.
//
//   xserv-server -m DIR [--host 127.0.0.1] [--port 8080] [options]   (--help lists them all)
//
// Endpoints (docs/server.md): GET /health, GET /v1/models, POST /v1/chat/completions,
// POST /v1/completions (both also streaming as Server-Sent Events), GET / (the chat page).
//
// How it works
// - It is an application over the public API only (include/xserv/xserv.hpp over libxserv), as a
//   user of the library would write it.
// - One engine thread, owned by the server, calls Engine::step() while the engine has work and
//   sleeps on a condition variable that every submit signals. Why not the engine's
//   background_thread: the server then owns the order of shutdown (the loop stops before the
//   engine is freed), sees and logs a failed step, and needs no polling for new work.
// - HTTP handlers (cpp-httplib's thread pool, one thread per open request) parse the body
//   (openai.cpp), render and tokenize the prompt themselves (so a prompt past the context is a
//   400 before anything is queued, and usage counts are exact), submit one engine request per
//   prompt with a callback that pushes the events into the handler's Channel, and wait on it.
//   Streaming handlers write each event as an SSE chunk as it comes; a failed write (the client
//   went away) cancels the request, which frees its KV blocks at the next step.
// - The model loads after the port is bound: /health answers 503 until it is ready.
//
// Libraries (Debian packages, scripts/install-deps.sh): cpp-httplib (libcpp-httplib-dev) for
// HTTP/1.1 with chunked responses, keep-alive, a thread pool and a body size limit in one
// well-kept header + library; nlohmann::json (nlohmann-json3-dev) to read and write JSON
// (simdjson, already a dependency of the library, only reads).
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <httplib.h>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <xserv/xserv.hpp>

#include "openai.hpp"

namespace xserv::server {

extern const char* const kChatPage;  // chat.html, embedded at build time (chat_page.cpp)

namespace {

constexpr const char* kUsage =
    "usage: xserv-server -m DIR [options]\n"
    "\n"
    "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models,\n"
    "/health) and a chat page (GET /) over one model.\n"
    "\n"
    "options:\n"
    "  -m, --model DIR           model directory (config.json, *.safetensors, tokenizer)\n"
    "  --host ADDR               address to bind (default 127.0.0.1: this machine only)\n"
    "  --port N                  port (default 8080; 0 = any free port, printed at start)\n"
    "  --model-name NAME         the model id clients send and /v1/models lists\n"
    "                            (default: the directory's name)\n"
    "  --api-key KEY             require 'Authorization: Bearer KEY' on /v1/* (default: the\n"
    "                            XSERV_API_KEY environment variable; none when unset)\n"
    "  --device auto|cpu|cuda    (default auto: CUDA when available)\n"
    "  --device-index N          which GPU (default 0)\n"
    "  --tp N                    split the model over N GPUs from --device-index on\n"
    "                            (tensor parallelism over NCCL; default 1)\n"
    "  --threads N               CPU threads (default: all)\n"
    "  --max-seqs N              requests running at once (default 256)\n"
    "  --max-batch-tokens N      tokens per engine step, prompt chunks and decodes (default\n"
    "                            8192 on CUDA, 512 on the CPU)\n"
    "  --kv-cache-tokens N       KV-cache size in tokens (default: sized from memory)\n"
    "  --kv-cache-dtype D        auto (default: the backend's), f32 or bf16 (CPU: half the\n"
    "                            cache's memory and bytes; CUDA: only the weights' dtype)\n"
    "  --gpu-memory-fraction F   CUDA: share of free memory for the KV cache (default 0.9)\n"
    "  --no-prefix-cache         do not reuse the KV of shared prompt prefixes\n"
    "  --max-queue N             requests waiting at most; more get 429 (default 256, 0 = no\n"
    "                            limit)\n"
    "  --max-body-bytes N        request bodies larger than this get 413 (default 8388608)\n"
    "  --http-threads N          HTTP worker threads, one per open request (default:\n"
    "                            max-seqs + max-queue + 16)\n"
    "  --no-chat-page            do not serve the chat page at /\n"
    "  -v, --verbose             log every request to stderr\n"
    "  -h, --help                this text\n";

struct Options {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model_name;
  std::string api_key;
  xserv::ModelOptions model;
  xserv::EngineOptions engine;
  std::size_t max_body_bytes = 8u << 20;
  int http_threads = 0;
  bool chat_page = true;
  bool verbose = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "xserv-server: %s\n\n%s", message.c_str(), kUsage);
  std::exit(2);
}

long long integer_arg(const std::string& flag, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || errno != 0 || n < lo || n > hi)
    usage_error(flag + " takes an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], not '" + v + "'");
  return n;
}

Options parse_options(int argc, char** argv) {
  Options o;
  o.engine.max_waiting = 256;
  if (const char* key = std::getenv("XSERV_API_KEY")) o.api_key = key;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    auto integer = [&](long long lo, long long hi) { return integer_arg(a, value(), lo, hi); };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "-m" || a == "--model") o.model_dir = value();
    else if (a == "--host") o.host = value();
    else if (a == "--port") o.port = static_cast<int>(integer(0, 65535));
    else if (a == "--model-name") o.model_name = value();
    else if (a == "--api-key") o.api_key = value();
    else if (a == "--device") {
      const std::string d = value();
      if (d == "auto") o.model.device = xserv::Device::automatic;
      else if (d == "cpu") o.model.device = xserv::Device::cpu;
      else if (d == "cuda") o.model.device = xserv::Device::cuda;
      else usage_error("--device takes auto, cpu or cuda, not '" + d + "'");
    } else if (a == "--device-index") o.model.device_index = static_cast<int>(integer(0, 1024));
    else if (a == "--tp") o.model.tensor_parallel_size = static_cast<int>(integer(1, 1024));
    else if (a == "--threads") o.model.threads = static_cast<int>(integer(0, 4096));
    else if (a == "--max-seqs") o.engine.max_seqs = static_cast<int>(integer(1, 1 << 20));
    else if (a == "--max-batch-tokens") o.engine.max_batch_tokens = static_cast<int>(integer(1, 1 << 20));
    else if (a == "--kv-cache-tokens") o.engine.kv_cache_tokens = integer(0, 1ll << 40);
    else if (a == "--kv-cache-dtype") {
      const std::string d = value();
      if (d == "auto") o.model.kv_cache_dtype = xserv::DType::automatic;
      else if (d == "f32") o.model.kv_cache_dtype = xserv::DType::f32;
      else if (d == "bf16") o.model.kv_cache_dtype = xserv::DType::bf16;
      else usage_error("--kv-cache-dtype takes auto, f32 or bf16, not '" + d + "'");
    }
    else if (a == "--gpu-memory-fraction") {
      const std::string v = value();
      char* end = nullptr;
      const float f = std::strtof(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(f > 0.0f && f <= 1.0f))
        usage_error("--gpu-memory-fraction takes a number in (0, 1], not '" + v + "'");
      o.engine.gpu_memory_fraction = f;
    } else if (a == "--no-prefix-cache") o.engine.prefix_cache = false;
    else if (a == "--max-queue") o.engine.max_waiting = static_cast<int>(integer(0, 1 << 24));
    else if (a == "--max-body-bytes") o.max_body_bytes = static_cast<std::size_t>(integer(1, 1ll << 32));
    else if (a == "--http-threads") o.http_threads = static_cast<int>(integer(1, 1 << 16));
    else if (a == "--no-chat-page") o.chat_page = false;
    else if (a == "-v" || a == "--verbose") o.verbose = true;
    else usage_error("unknown option '" + a + "'");
  }
  if (o.model_dir.empty()) usage_error("-m DIR is required");
  // A server lives on throughput: on a GPU, steps of 8192 tokens take a batch of prompts in one
  // forward (docs/benchmarks.md, "Steps of 2048 .. 16384 tokens": 8192 instead of 2048 raised
  // Qwen3-1.7B's output at 128 requests at once by 6%) while a step stays short enough for the
  // decodes riding in it.
  // The CPU keeps the library's default (512): a CPU forward of 8192 tokens would stall every
  // stream for seconds. The model's workspace is sized for the step, so both get the value.
  const bool cuda = o.model.device == xserv::Device::cuda ||
                    (o.model.device == xserv::Device::automatic && xserv::cuda_available());
  if (o.engine.max_batch_tokens == 0 && cuda) o.engine.max_batch_tokens = 8192;
  o.model.max_batch_tokens = o.engine.max_batch_tokens;  // 0: the library's default
  if (o.model_name.empty())
    o.model_name = std::filesystem::path(o.model_dir).lexically_normal().filename().string();
  if (o.model_name.empty())  // "dir/" normalizes to an empty filename
    o.model_name = std::filesystem::path(o.model_dir).lexically_normal().parent_path().filename().string();
  // Every running or queued request holds an HTTP thread while it waits for its events, so the
  // pool covers both (and some for /health and quick errors); past it, new connections wait
  // for a free thread. With no queue limit, the pool allows a queue as long as the batch.
  if (o.http_threads == 0) {
    const long long n = 16ll + o.engine.max_seqs +
                        (o.engine.max_waiting > 0 ? o.engine.max_waiting : o.engine.max_seqs);
    o.http_threads = static_cast<int>(std::min(n, 4096ll));
  }
  return o;
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// a == b in a time that does not depend on where they differ (the API key check).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// The HTTP status and OpenAI error of an xserv failure.
ApiError api_error(xserv_status status, const std::string& message) {
  switch (status) {
    case XSERV_ERR_INVALID_ARGUMENT:
    case XSERV_ERR_UNSUPPORTED:
      return invalid_request(message);
    case XSERV_ERR_RESOURCE_EXHAUSTED:
      return ApiError(400, "invalid_request_error", message, "", "context_length_exceeded");
    default:
      return ApiError(500, "server_error", message);
  }
}

// The events of one HTTP request's engine requests, handed from the engine thread (callbacks)
// to the handler thread. `choice` numbers the samples of every prompt: prompt p's sample i is
// choice p * n + i.
struct Channel {
  struct Item {
    int choice;
    xserv::Event event;
  };
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Item> items;

  // The next event, or none after `timeout`.
  std::optional<Item> next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cv.wait_for(lock, timeout, [&] { return !items.empty(); })) return std::nullopt;
    Item item = std::move(items.front());
    items.pop_front();
    return item;
  }
};

// The callback of one engine request: its events go to `channel` as choices first_choice + i.
// It holds the channel, so events that come after the handler gave up (a cancel takes effect at
// the next step) land in a live object.
xserv::EventCallback feed(std::shared_ptr<Channel> channel, int first_choice) {
  return [channel = std::move(channel), first_choice](const xserv::Event& e) {
    {
      std::lock_guard<std::mutex> lock(channel->mutex);
      channel->items.push_back({first_choice + e.index, e});
    }
    channel->cv.notify_one();
  };
}

// cpp-httplib's server with the listen backlog widened. Debian's library is compiled with a
// backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG), so 64 clients connecting at once overflow the accept
// queue and some are reset; Linux lets listen() on a listening socket change its backlog.
class HttpServer : public httplib::Server {
 public:
  bool widen_backlog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

class Server {
 public:
  explicit Server(Options options) : o_(std::move(options)) {}

  int run() {
    http_.new_task_queue = [n = o_.http_threads] { return new httplib::ThreadPool(n); };
    http_.set_payload_max_length(o_.max_body_bytes);
    http_.set_read_timeout(30);
    http_.set_write_timeout(30);
    http_.set_tcp_nodelay(true);
    routes();
    const int port = o_.port == 0 ? http_.bind_to_any_port(o_.host)
                                  : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
    if (port < 0) {
      std::fprintf(stderr, "xserv-server: cannot listen on %s:%d\n", o_.host.c_str(), o_.port);
      return 1;
    }
    if (!http_.widen_backlog(std::max(o_.http_threads, SOMAXCONN)))
      std::fprintf(stderr, "xserv-server: cannot widen the listen backlog: %s\n", std::strerror(errno));
    std::fprintf(stderr, "xserv-server: listening on http://%s:%d (loading %s)\n", o_.host.c_str(),
                 port, o_.model_dir.c_str());
    std::atomic<bool> listener_done{false};
    std::thread listener([this, &listener_done] {
      http_.listen_after_bind();
      listener_done.store(true);
    });
    const int status = load() ? 0 : 1;
    if (status == 0) {
      const std::string step = o_.engine.max_batch_tokens > 0
                                   ? ", " + std::to_string(o_.engine.max_batch_tokens) + " tokens a step"
                                   : std::string();  // the library's default
      std::fprintf(stderr, "xserv-server: ready: %s as '%s'%s\n", model_->desc().c_str(),
                   o_.model_name.c_str(), step.c_str());
      wait_for_signal();
    }
    // Handlers still waiting for events cancel their requests (they look at this flag at least
    // once a second), so the HTTP pool's shutdown does not wait for long generations.
    shutting_down_.store(true);
    // cpp-httplib's stop() does nothing until the accept loop has started (is_running()), and
    // that loop would then never end: a model refused at once (--tp 3) could get here first.
    while (!http_.is_running() && !listener_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http_.stop();
    listener.join();
    stop_engine();
    return status;
  }

 private:
  bool load() {
    try {
      model_ = std::make_unique<xserv::Model>(xserv::Model::load(o_.model_dir, o_.model));
      engine_ = std::make_unique<xserv::Engine>(*model_, o_.engine);
    } catch (const xserv::Error& e) {
      std::fprintf(stderr, "xserv-server: %s: %s\n", e.status_name(), e.what());
      return false;
    }
    engine_thread_ = std::thread([this] { engine_loop(); });
    ready_.store(true, std::memory_order_release);
    return true;
  }

  // SIGINT / SIGTERM were blocked in every thread (main); wait for one here.
  static void wait_for_signal() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr, "xserv-server: %s, stopping\n", strsignal(sig));
  }

  void engine_loop() {
    std::unique_lock<std::mutex> lock(loop_mutex_);
    while (!stopping_) {
      if (!engine_->has_work()) {
        // Woken by submit(); the timeout only bounds a missed wake-up.
        loop_cv_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      lock.unlock();
      try {
        engine_->step();
      } catch (const std::exception& e) {
        // The engine has ended the step's requests with this error in their events.
        std::fprintf(stderr, "xserv-server: engine step failed: %s\n", e.what());
      }
      lock.lock();
    }
  }

  void stop_engine() {
    {
      std::lock_guard<std::mutex> lock(loop_mutex_);
      stopping_ = true;
    }
    loop_cv_.notify_all();
    if (engine_thread_.joinable()) engine_thread_.join();
    engine_.reset();
    model_.reset();
  }

  xserv::RequestId submit(const xserv::Request& request) {
    const xserv::RequestId id = engine_->submit(request);
    // Taking the loop's lock orders this wake-up after the loop's has_work() check or before its
    // wait, so it is never lost.
    {
      std::lock_guard<std::mutex> lock(loop_mutex_);
    }
    loop_cv_.notify_one();
    return id;
  }

  // ---- HTTP -----------------------------------------------------------------------------

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
  }

  void routes() {
    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
    http_.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&] { res.set_content(build_models(o_.model_name, started_), "application/json"); });
    });
    http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&] { complete(req, res, Endpoint::chat); });
    });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded(req, res, [&] { complete(req, res, Endpoint::completions); });
    });
    if (o_.chat_page) {
      http_.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(kChatPage, "text/html; charset=utf-8");
      });
    }
    // Statuses that cpp-httplib sets itself (404 no route, 413 body too large, 400 bad HTTP)
    // get an OpenAI-shaped body too.
    http_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const int s = res.status;
      const std::string message = s == 404   ? "no such endpoint"
                                  : s == 413 ? "the request body is too large"
                                             : "bad request (status " + std::to_string(s) + ")";
      send_error(res, ApiError(s, s >= 500 ? "server_error" : "invalid_request_error", message, "",
                               s == 404 ? "not_found" : ""));
    });
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, "server_error", what));
    });
    if (o_.verbose) {
      http_.set_logger([](const httplib::Request& req, const httplib::Response& res) {
        std::fprintf(stderr, "xserv-server: %s %s -> %d\n", req.method.c_str(), req.path.c_str(), res.status);
      });
    }
  }

  void health(httplib::Response& res) {
    if (!ready_.load(std::memory_order_acquire)) {
      send_error(res, ApiError(503, "server_error", "the model is loading", "", "model_loading"));
      return;
    }
    const xserv::EngineStats s = engine_->stats();
    const nlohmann::json j = {{"status", "ok"},          {"model", o_.model_name},
                              {"running", s.running},    {"waiting", s.waiting},
                              {"kv_blocks_used", s.kv_blocks_used},
                              {"kv_blocks_total", s.kv_blocks_total}};
    res.set_content(j.dump(), "application/json");
  }

  // Runs `body` for a /v1 endpoint: the API key, readiness, and errors as OpenAI bodies.
  template <typename F>
  void guarded(const httplib::Request& req, httplib::Response& res, F&& body) {
    try {
      if (!o_.api_key.empty() && !same_secret(req.get_header_value("Authorization"), "Bearer " + o_.api_key))
        throw ApiError(401, "invalid_request_error",
                       req.has_header("Authorization") ? "incorrect API key provided"
                                                       : "missing API key (Authorization: Bearer KEY)",
                       "", "invalid_api_key");
      if (!ready_.load(std::memory_order_acquire))
        throw ApiError(503, "server_error", "the model is loading", "", "model_loading");
      body();
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const xserv::Error& e) {
      send_error(res, api_error(e.status(), e.what()));
    }
  }

  // The prompt ids of the request's prompts (one for chat). Throws ApiError.
  std::vector<std::vector<std::int32_t>> prepare(const CompletionRequest& r) const {
    std::vector<std::vector<std::int32_t>> out;
    const std::string param = r.endpoint == Endpoint::chat ? "messages" : "prompt";
    auto add = [&](std::vector<std::int32_t> ids) {
      if (ids.empty()) throw invalid_request("the prompt is empty", param);
      if (static_cast<std::int64_t>(ids.size()) >= model_->n_ctx())
        throw invalid_request("the prompt has " + std::to_string(ids.size()) +
                                  " tokens; this model's context is " +
                                  std::to_string(model_->n_ctx()) + " tokens",
                              param, "context_length_exceeded");
      out.push_back(std::move(ids));
    };
    if (r.endpoint == Endpoint::chat) {
      if (model_->has_chat_template()) {
        std::vector<xserv::ChatMessage> messages;
        for (const Message& m : r.messages) messages.push_back({m.role, m.content});
        // Markers typed in a message stay text: a client cannot forge a system turn.
        add(model_->tokenize_chat(messages, true, r.enable_thinking));
      } else {
        add(model_->tokenize(render_plain(r.messages), false));
      }
      return out;
    }
    for (const Prompt& p : r.prompts) {
      if (!p.is_tokens) {
        add(model_->tokenize(p.text, false));
        continue;
      }
      for (std::int32_t id : p.tokens)
        if (id >= model_->n_vocab())
          throw invalid_request("token id " + std::to_string(id) + " is past the vocabulary (" +
                                    std::to_string(model_->n_vocab()) + ")",
                                "prompt");
      add(p.tokens);
    }
    return out;
  }

  xserv::Request engine_request(const CompletionRequest& r, std::vector<std::int32_t> tokens) const {
    xserv::Request q;
    const int room = model_->n_ctx() - static_cast<int>(tokens.size());
    q.prompt_tokens = std::move(tokens);
    xserv::GenerateOptions& g = q.options;
    g.max_tokens = r.max_tokens ? std::min(*r.max_tokens, room) : room;
    g.temperature = r.temperature;
    g.top_p = r.top_p;
    g.top_k = r.top_k;
    g.min_p = r.min_p;
    g.presence_penalty = r.presence_penalty;
    g.frequency_penalty = r.frequency_penalty;
    g.repetition_penalty = r.repetition_penalty;
    g.seed = r.seed;
    g.stop = r.stop;
    g.ignore_eos = r.ignore_eos;
    q.n = r.n;
    // The engine reports the sampled token's own log-probability together with the top list;
    // ask for at least one so logprobs without top_logprobs has it (the extra is not sent).
    q.logprobs = r.logprobs ? std::max(1, r.top_logprobs) : 0;
    return q;
  }

  void complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    auto r = std::make_shared<CompletionRequest>(parse_request(req.body, endpoint));
    if (!r->model.empty() && r->model != o_.model_name)
      throw ApiError(404, "invalid_request_error",
                     "the model '" + r->model + "' does not exist (this server has '" +
                         o_.model_name + "')",
                     "model", "model_not_found");
    std::vector<std::vector<std::int32_t>> prompts = prepare(*r);

    auto call = std::make_shared<Call>();
    call->server = this;
    call->request = r;
    call->meta = {endpoint,
                  (endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-") + random_id(),
                  unix_now(), o_.model_name, r->logprobs};
    call->choices.resize(prompts.size() * static_cast<std::size_t>(r->n));
    call->open = static_cast<int>(call->choices.size());
    call->prompt_usage.resize(prompts.size());
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      xserv::Request q = engine_request(*r, std::move(prompts[p]));
      q.on_event = feed(call->channel, static_cast<int>(p) * r->n);
      try {
        call->ids.push_back(submit(q));
      } catch (const xserv::Error& e) {
        call->cancel_all();
        if (e.status() == XSERV_ERR_RESOURCE_EXHAUSTED)
          throw ApiError(429, "rate_limit_error", "the server's queue is full; retry later", "",
                         "queue_full");
        throw;
      }
    }
    if (!r->stream) {
      finish_blocking(*call, res);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [call](std::size_t, httplib::DataSink& sink) {
          if (!call->stream(sink)) return false;
          sink.done();
          return true;
        },
        [call](bool) { call->cancel_all(); });
  }

  // One HTTP request in flight: its engine requests and what their choices produced.
  struct Call {
    Server* server = nullptr;
    std::shared_ptr<const CompletionRequest> request;
    ResponseMeta meta;
    std::vector<xserv::RequestId> ids;
    std::shared_ptr<Channel> channel = std::make_shared<Channel>();
    std::vector<Choice> choices;
    std::vector<std::optional<Usage>> prompt_usage;  // per prompt, from its first ended sample
    int completion_tokens = 0;
    int open = 0;  // choices not yet ended
    std::optional<ApiError> failure;

    bool cancelled = false;

    void cancel_all() {
      if (open == 0 || cancelled) return;
      cancelled = true;
      for (xserv::RequestId id : ids) server->engine_->cancel(id);
    }

    Usage usage() const {
      Usage u;
      for (const auto& p : prompt_usage) {
        if (!p) continue;
        u.prompt_tokens += p->prompt_tokens;
        u.cached_tokens += p->cached_tokens;
      }
      u.completion_tokens = completion_tokens;
      return u;
    }

    // Folds one event into the choice; returns its log-probability record when logprobs are on.
    std::optional<TokenLogprob> absorb(const Channel::Item& item) {
      const xserv::Event& e = item.event;
      Choice& c = choices[static_cast<std::size_t>(item.choice)];
      c.text += e.text;
      std::optional<TokenLogprob> lp;
      if (e.type == xserv::EventType::token && meta.logprobs) {
        lp = TokenLogprob{e.token, e.logprob, {}};
        const std::size_t k = std::min<std::size_t>(e.top_logprobs.size(),
                                                    static_cast<std::size_t>(request->top_logprobs));
        for (std::size_t i = 0; i < k; ++i) lp->top.emplace_back(e.top_logprobs[i].token, e.top_logprobs[i].logprob);
        c.logprobs.push_back(*lp);
      }
      if (e.ends_sample()) {
        --open;
        completion_tokens += e.completion_tokens;
        auto& pu = prompt_usage[static_cast<std::size_t>(item.choice / request->n)];
        if (!pu) pu = Usage{e.prompt_tokens, e.cached_tokens, 0};
        c.finish_reason = e.finish == xserv::FinishReason::length ? "length" : "stop";
        if (e.finish == xserv::FinishReason::error && !failure) failure = api_error(e.status, e.error);
      }
      return lp;
    }

    // Streams every event as SSE; false when the client went away (the requests are then
    // cancelled by the releaser).
    bool stream(httplib::DataSink& sink) {
      const TokenText text_of = [this](std::int32_t id) { return server->token_text(id); };
      auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
      for (std::size_t i = 0; i < choices.size(); ++i)
        if (!send(sse_event(build_chunk(meta, static_cast<int>(i), "", {}, "", true, text_of)))) return false;
      while (open > 0) {
        if (server->shutting_down_.load()) cancel_all();
        std::optional<Channel::Item> item = channel->next(std::chrono::seconds(1));
        if (!item) {
          // An SSE comment: keeps proxies from timing out and finds a vanished client.
          if (!send(": keep-alive\n\n")) return false;
          continue;
        }
        const std::optional<TokenLogprob> lp = absorb(*item);
        if (failure) {
          cancel_all();
          return send(sse_event(error_body(*failure))) && send(std::string(kSseDone));
        }
        const std::vector<TokenLogprob> lps = lp ? std::vector<TokenLogprob>{*lp} : std::vector<TokenLogprob>{};
        if (!item->event.text.empty() || !lps.empty())
          if (!send(sse_event(build_chunk(meta, item->choice, item->event.text, lps, "", false, text_of))))
            return false;
        if (item->event.ends_sample()) {
          const std::string& reason = choices[static_cast<std::size_t>(item->choice)].finish_reason;
          if (!send(sse_event(build_chunk(meta, item->choice, "", {}, reason, false, text_of)))) return false;
        }
      }
      if (request->include_usage && !send(sse_event(build_usage_chunk(meta, usage())))) return false;
      return send(std::string(kSseDone));
    }
  };

  void finish_blocking(Call& call, httplib::Response& res) {
    while (call.open > 0) {
      if (shutting_down_.load()) call.cancel_all();
      std::optional<Channel::Item> item = call.channel->next(std::chrono::seconds(1));
      if (item) call.absorb(*item);
      if (call.failure) {
        call.cancel_all();
        send_error(res, *call.failure);
        return;
      }
    }
    const TokenText text_of = [this](std::int32_t id) { return token_text(id); };
    res.set_content(build_response(call.meta, call.choices, call.usage(), text_of), "application/json");
  }

  std::string token_text(std::int32_t id) const { return model_->detokenize(&id, 1, false); }

  std::string random_id() {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%016llx%08x", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned>(++counter_));
    return buf;
  }

  Options o_;
  HttpServer http_;
  std::unique_ptr<xserv::Model> model_;
  std::unique_ptr<xserv::Engine> engine_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> shutting_down_{false};
  std::atomic<unsigned> counter_{0};
  const std::int64_t started_ = unix_now();

  std::thread engine_thread_;
  std::mutex loop_mutex_;
  std::condition_variable loop_cv_;
  bool stopping_ = false;
};

}  // namespace
}  // namespace xserv::server

int main(int argc, char** argv) {
  const xserv::server::Options options = xserv::server::parse_options(argc, argv);
  // A client that disconnects makes a write fail with EPIPE; without this it would kill us.
  signal(SIGPIPE, SIG_IGN);
  // SIGINT/SIGTERM are taken by sigwait in the main thread only: block them before any thread
  // starts (threads inherit the mask).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  xserv::server::Server server(options);
  return server.run();
}
