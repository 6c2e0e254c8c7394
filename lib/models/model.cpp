#include "models/model.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "io/json.hpp"
#include "models/model_registry.hpp"

namespace xserv {

namespace {

struct ConfigIdentity {
  std::string model_type;
  std::vector<std::string> architectures;
};

ConfigIdentity read_identity(const std::string& text, const std::string& source) {
  simdjson::dom::parser parser;
  auto root = json::parse(parser, text, source);
  simdjson::dom::object obj;
  XSERV_CHECK(root.get_object().get(obj) == simdjson::SUCCESS, ErrorCode::format,
              "{}: expected a JSON object", source);
  ConfigIdentity id;
  id.model_type = json::get_string(obj, "model_type", source).value_or("");
  simdjson::dom::array arr;
  if (obj.at_key("architectures").get_array().get(arr) == simdjson::SUCCESS) {
    for (auto e : arr) {
      std::string_view s;
      if (e.get_string().get(s) == simdjson::SUCCESS) id.architectures.emplace_back(s);
    }
  }
  return id;
}

// 1 + the largest N of the tensor names "<...>.<container>.N.<...>" (0 when none). Indices of
// up to 9 digits count; a longer one counts as absurdly many layers.
std::int64_t checkpoint_layers(const Checkpoint& checkpoint, std::string_view container) {
  std::int64_t layers = 0;
  for (const std::string& name : checkpoint.names()) {
    std::string_view rest(name);
    while (!rest.empty()) {
      const std::size_t dot = rest.find('.');
      const std::string_view part = rest.substr(0, dot);
      rest = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
      if (part != container) continue;
      const std::string_view index = rest.substr(0, rest.find('.'));
      if (index.empty() || index.find_first_not_of("0123456789") != std::string_view::npos) continue;
      const std::int64_t n = index.size() > 9 ? std::int64_t{1} << 40 : std::stoll(std::string(index));
      layers = std::max(layers, n + 1);
      break;
    }
  }
  return layers;
}

// The config's layer count must be the checkpoint's: fewer would leave tensors unused (a
// checkpoint for another model), more would allocate per-layer state from an unchecked number
// (n_layer = 1e6 took 3 GB before the first missing tensor was noticed).
void check_layer_count(const Checkpoint& checkpoint, const ModelConfig& config,
                       std::string_view container, const std::string& config_path) {
  const std::int64_t have = checkpoint_layers(checkpoint, container);
  XSERV_CHECK(have == config.num_layers, ErrorCode::format,
              "{}: the config has {} layers but the checkpoint in '{}' holds tensors of {} layers "
              "('{}.N.' names)",
              config_path, config.num_layers, checkpoint.dir(), have, container);
}

std::string known_models() {
  std::string s;
  for (const auto& e : model_registry())
    s += fmt::format("{}{} ({})", s.empty() ? "" : ", ", e.model_type, e.architecture);
  return s;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, Backend& backend,
                                   const ModelOptions& options) {
  const std::string config_path = dir + "/config.json";
  const std::string text = read_file(config_path);
  ConfigIdentity id = read_identity(text, config_path);
  const ModelEntry* entry = find_model(id.model_type, id.architectures);
  XSERV_CHECK(entry, ErrorCode::unsupported, "{}: model_type '{}' is not supported (known: {})",
              config_path, id.model_type, known_models());
  ModelConfig config = ModelConfig::parse(text, config_path);

  std::unique_ptr<Checkpoint> checkpoint;
  if (!options.dummy_weights) {
    checkpoint = std::make_unique<Checkpoint>(Checkpoint::open(dir));
    check_layer_count(*checkpoint, config, entry->layer_container, config_path);
  }
  WeightLoader weights(backend, checkpoint.get(), config.dtype, options.dummy_seed);
  std::unique_ptr<Model> model = entry->make(config, dir, backend, weights, options);
  if (options.kv_dtype) {
    XSERV_CHECK(backend.supports_kv_dtype(model->weight_dtype_, *options.kv_dtype),
                ErrorCode::unsupported, "{}: K/V cache dtype {} is not supported for {} weights on {}",
                dir, dtype_name(*options.kv_dtype), dtype_name(model->weight_dtype_), backend.name());
    model->kv_dtype_ = options.kv_dtype;
  }
  // The CPU backend's weights are views into the mapping; other backends hold copies, so the
  // mapping goes (no host memory kept for a model on the GPU).
  if (backend.device().kind == DeviceKind::cpu) model->checkpoint_ = std::move(checkpoint);
  else if (options.warm_up) model->warm_up();
  for (Buffer& b : weights.take_owned()) model->weight_buffers_.push_back(std::move(b));
  return model;
}

void Model::warm_up() {
  const std::int32_t block = 16;
  const std::int32_t longest = std::min(max_batch_tokens_, config_.max_position_embeddings);
  // Blocks 0 .. for the longest prompt, addressed directly (the pool needs at least two).
  kv::KvCache cache(backend_, kv_spec(),
                    kv::KvCacheOptions{block, std::max(2, (longest + block - 1) / block), 0});
  // The backend may time kernel choices while this runs (Backend::set_warming_up), also when a
  // forward throws.
  struct WarmingUp {
    Backend& be;
    explicit WarmingUp(Backend& b) : be(b) { be.set_warming_up(true); }
    ~WarmingUp() { be.set_warming_up(false); }
    WarmingUp(const WarmingUp&) = delete;
    WarmingUp& operator=(const WarmingUp&) = delete;
  } warming_up(backend_);
  // Every length up to 8 (GEMM algorithms are chosen per exact row count there), 16, every
  // multiple of 32 up to 256 (batched decode's GEMM buckets when the CUDA backend times them,
  // XSERV_CUDA_GEMM_TUNE: cuda/gemm.hpp), then powers of two (one choice per bucket). Every row
  // is a logits row while they fit, so the lm_head meets the row counts of batched decode steps
  // too (one token a sequence).
  auto next = [](std::int32_t m) { return m < 8 ? m + 1 : m < 32 ? 2 * m : m < 256 ? m + 32 : 2 * m; };
  for (std::int32_t m = 1;; m = std::min(next(m), longest)) {
    ForwardBatch b;
    for (std::int32_t i = 0; i < m; ++i) {
      b.token_ids.push_back(i % config_.vocab_size);
      b.positions.push_back(i);
      b.slot_mapping.push_back(i);
    }
    b.query_start = {0, m};
    b.context_lens = {m};
    b.max_blocks_per_seq = (m + block - 1) / block;
    for (std::int32_t i = 0; i < b.max_blocks_per_seq; ++i) b.block_tables.push_back(i);
    if (m <= max_logit_rows_) {
      for (std::int32_t i = 0; i < m; ++i) b.logit_rows.push_back(i);
    } else {
      b.logit_rows = {m - 1};
    }
    const Tensor logits = forward(b, cache);  // rank 0's rows; other ranks' are empty
    // The default sampling path of chat models (temperature, top-k, top-p) and greedy.
    SamplingBatch params;
    params.rows.push_back(SamplingRow{});
    params.rows[0].temperature = (m % 2 == 0) ? 0.6f : 0.0f;
    params.rows[0].top_k = 20;
    params.rows[0].top_p = 0.95f;
    std::int32_t id = 0;
    if (shard_.leader()) backend_.sample(logits.rows(logits.shape[0] - 1, 1), params, &id);
    if (m == longest) break;
  }
  backend_.synchronize();
}

void Model::check_tokenizer(std::int32_t tokenizer_vocab, const std::string& tokenizer_source) const {
  XSERV_CHECK(tokenizer_vocab <= config_.vocab_size, ErrorCode::format,
              "{}: the tokenizer has ids up to {} but the model's embedding has {} rows ({})",
              tokenizer_source, tokenizer_vocab - 1, config_.vocab_size, dir_);
}

kv::KvSpec Model::kv_spec() const noexcept {
  return kv::KvSpec{config_.num_layers, shard_.kv_heads, config_.head_dim,
                    kv_dtype_.value_or(backend_.kv_dtype(weight_dtype_))};
}

void Model::set_limits(const ModelOptions& options) {
  XSERV_CHECK(options.max_batch_tokens > 0 && options.max_batch_tokens <= (1 << 20),
              ErrorCode::invalid_argument, "max_batch_tokens {} (expected 1 ..= {})",
              options.max_batch_tokens, 1 << 20);
  XSERV_CHECK(options.max_logit_rows >= 0, ErrorCode::invalid_argument, "max_logit_rows {}",
              options.max_logit_rows);
  max_batch_tokens_ = options.max_batch_tokens;
  max_logit_rows_ = options.max_logit_rows > 0
                        ? std::min(options.max_logit_rows, max_batch_tokens_)
                        : std::min(max_batch_tokens_, 256);
  const Communicator* comm = options.communicator;
  shard_ = Shard::plan(config_, comm ? comm->rank() : 0, comm ? comm->size() : 1,
                       dir_ + "/config.json");
  communicator_ = options.communicator;
  // Measurement only (docs/parallel.md): XSERV_TP_NO_ALLREDUCE=1 leaves the all-reduces out, so
  // a benchmark's step time without them, against the real one, gives their share. The
  // results are wrong then (each rank sees only its partial sums).
  if (const char* env = std::getenv("XSERV_TP_NO_ALLREDUCE"); env && std::string_view(env) == "1")
    communicator_ = nullptr;
}

WeightLayout Model::conv1d_layout() const noexcept {
  // CPU: 32-column panels by default (WeightLayout::panel32; a model falls back to out_in for
  // weights that do not fit them): the prefill GEMM multiplies them in place instead of packing a
  // tile per task. GPT-2 124M f32 on the GPU machine's Xeon at 8 threads (docs/benchmarks.md,
  // issue 16, 2026-12-04; 3 interleaved runs, medians): prefill 3709 tok/s against 3270
  // transposed, decode 206.1 against 195.1; the GEMMs alone 4-13% faster at 8 threads.
  // XSERV_CPU_CONV1D=out_in transposes them as before. Transposed over as stored: on the
  // Xeon (3 runs each, medians) GPT-2 124M f32 decodes 4-31% faster at 2-16 threads and
  // prefills 2-11% faster (docs/benchmarks.md, issue 16, sixth session). CUDA: transposed; the
  // one-row GEMV of [in, out] weights splits K over blocks and merges partial sums, which streamed GPT-2's 2-9 MB weights at ~0.8 TB/s; the [out, in] GEMV
  // with its LayerNorm prologue and GELU epilogue is the Qwen3 kernel (docs/benchmarks.md,
  // "GPT-2 decode with transposed Conv1D weights"). XSERV_CPU_CONV1D=in_out /
  // XSERV_CUDA_CONV1D=in_out keep them as stored.
  const bool cpu = backend_.device().kind == DeviceKind::cpu;
  const char* v = std::getenv(cpu ? "XSERV_CPU_CONV1D" : "XSERV_CUDA_CONV1D");
  const std::string_view s(v ? v : "");
  if (s == "in_out") return WeightLayout::in_out;
  return cpu && s != "out_in" ? WeightLayout::panel32 : WeightLayout::out_in;
}

Tensor Model::pack_panels(const Tensor& w) {
  constexpr std::int64_t pw = weight_panel_width;
  XSERV_CHECK(w.shape.rank() == 2 && w.shape[1] % pw == 0 && w.device.kind == DeviceKind::cpu,
              ErrorCode::internal, "pack_panels: a 2-D CPU weight with N a multiple of {}, not {}", pw, w.shape);
  const std::int64_t k = w.shape[0], n = w.shape[1];
  const auto es = static_cast<std::int64_t>(dtype_size(w.dtype));
  Buffer& b = weight_buffers_.emplace_back(backend_.allocator(), w.bytes());
  const auto* src = static_cast<const char*>(w.data);
  auto* dst = static_cast<char*>(b.data());
  // Panel p holds columns [32p, 32p + 32) of every row k, one run of 32 weights per k.
  for (std::int64_t p = 0; p < n / pw; ++p)
    for (std::int64_t r = 0; r < k; ++r)
      std::memcpy(dst + (p * k + r) * pw * es, src + (r * n + p * pw) * es,
                  static_cast<std::size_t>(pw * es));
  return Tensor(b.data(), w.dtype, w.shape, w.device);
}

Tensor Model::transpose_in_out(const Tensor& w) {
  XSERV_CHECK(w.shape.rank() == 2 && w.device == backend_.device(), ErrorCode::internal,
              "transpose_in_out: a 2-D weight of this backend, not {}", w.shape);
  const Shape t_shape{w.shape[1], w.shape[0]};
  if (backend_.device().kind == DeviceKind::cpu) {
    // CPU weights are views of the read-only mapping: the transpose is a copy the model keeps.
    Buffer& b = weight_buffers_.emplace_back(backend_.allocator(), w.bytes());
    Tensor t(b.data(), w.dtype, t_shape, w.device);
    backend_.transpose(t, w);
    return t;
  }
  // A device weight is replaced in place, through a scratch copy, so it is held once.
  Buffer scratch(backend_.allocator(), w.bytes());
  Tensor t(scratch.data(), w.dtype, t_shape, w.device);
  backend_.transpose(t, w);
  Tensor in_place(w.data, w.dtype, t_shape, w.device);
  backend_.copy(in_place, t);
  backend_.synchronize();  // before the scratch is freed
  return in_place;
}

void Model::plan_workspace(Tensor* dst, DType dtype, Shape shape) {
  planned_.push_back(Planned{dst, dtype, shape});
}

void Model::allocate_workspace() {
  auto aligned = [](std::size_t b) { return (b + 63) / 64 * 64; };
  std::size_t total = 0;
  for (const auto& p : planned_)
    total += aligned(static_cast<std::size_t>(p.shape.numel()) * dtype_size(p.dtype));
  workspace_ = Buffer(backend_.allocator(), std::max<std::size_t>(total, 64));
  auto* base = static_cast<std::uint8_t*>(workspace_.data());
  std::size_t offset = 0;
  for (const auto& p : planned_) {
    *p.dst = Tensor(base + offset, p.dtype, p.shape, backend_.device());
    offset += aligned(static_cast<std::size_t>(p.shape.numel()) * dtype_size(p.dtype));
  }
  planned_.clear();
}

Tensor Model::forward(const DeviceBatch& batch, kv::KvCache& cache) {
  XSERV_CHECK(batch.num_tokens > 0 && batch.num_tokens <= max_batch_tokens_,
              ErrorCode::invalid_argument, "forward: {} tokens (the workspace holds 1 ..= {})",
              batch.num_tokens, max_batch_tokens_);
  XSERV_CHECK(batch.num_logit_rows >= 0 && batch.num_logit_rows <= max_logit_rows_,
              ErrorCode::invalid_argument, "forward: {} logit rows (at most {})",
              batch.num_logit_rows, max_logit_rows_);
  XSERV_CHECK(batch.max_context_len <= config_.max_position_embeddings,
              ErrorCode::invalid_argument,
              "forward: a context of {} tokens exceeds max_position_embeddings {}",
              batch.max_context_len, config_.max_position_embeddings);
  const kv::KvSpec want = kv_spec();
  const kv::KvSpec& have = cache.spec();
  XSERV_CHECK(have.num_layers == want.num_layers && have.num_kv_heads == want.num_kv_heads &&
                  have.head_dim == want.head_dim && have.dtype == want.dtype,
              ErrorCode::invalid_argument,
              "forward: KV cache of {} layers x {} heads x {} ({}) does not fit a model of {} x "
              "{} x {} ({})",
              have.num_layers, have.num_kv_heads, have.head_dim, dtype_name(have.dtype),
              want.num_layers, want.num_kv_heads, want.head_dim, dtype_name(want.dtype));
  return run(batch, cache);
}

Tensor Model::forward(const ForwardBatch& batch, kv::KvCache& cache) {
  batch.validate(cache.block_size());
  for (std::size_t i = 0; i < batch.token_ids.size(); ++i)
    XSERV_CHECK(batch.token_ids[i] >= 0 && batch.token_ids[i] < config_.vocab_size,
                ErrorCode::invalid_argument, "forward: token {} at row {} is outside the vocab of {}",
                batch.token_ids[i], i, config_.vocab_size);
  const auto slots = static_cast<std::int64_t>(cache.capacity_tokens());
  for (std::size_t i = 0; i < batch.slot_mapping.size(); ++i)
    XSERV_CHECK(batch.slot_mapping[i] < slots, ErrorCode::invalid_argument,
                "forward: slot {} at row {} is outside the cache of {} slots",
                batch.slot_mapping[i], i, slots);
  for (auto b : batch.block_tables)
    XSERV_CHECK(b >= 0 && b < cache.num_blocks(), ErrorCode::invalid_argument,
                "forward: block {} is outside the cache of {} blocks", b, cache.num_blocks());
  return forward(backend_.upload_batch(batch), cache);
}

}  // namespace xserv
