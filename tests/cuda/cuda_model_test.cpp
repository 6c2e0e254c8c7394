// Whole models on the CUDA backend: the committed Hugging Face fixtures (tiny GPT-2/Qwen3 in
// f32 and bf16, the f16 Shakespeare model), and decode steps recorded as CUDA graphs against the
// same steps run eagerly.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/mapped_file.hpp"
#include "cuda_test_util.hpp"
#include "engine/generate.hpp"
#include "io/safetensors.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "support/golden.hpp"
#include "support/scoped_env.hpp"
#include "support/temp_dir.hpp"

using namespace xserv;
using namespace xserv::test;

namespace {

using test::decode_batch;
using test::prefill_batch;

// f32 models: HF's f32 logits within 1e-4 of the row's scale and the same greedy ids; 16-bit
// models (bf16 activations on the GPU, HF in f32 on upcast weights): within 5e-2 of the scale.
void check_golden(const std::string& model_dir, const std::string& golden_dir) {
  INFO("model " << model_dir);
  auto backend = cuda::make_cuda_backend({});
  ModelOptions opts;
  opts.max_batch_tokens = 64;
  auto model = Model::load(model_dir, *backend, opts);
  const bool f32 = model->activation_dtype() == DType::f32;
  const auto cases = read_golden_cases(golden_dir + "/golden.json");
  const auto golden = SafetensorsFile::open(golden_dir + "/golden.safetensors");
  const std::int64_t vocab = model->config().vocab_size;
  kv::KvCache cache(*backend, model->kv_spec(), {16, 16, 0});
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const GoldenCase& c = cases[ci];
    INFO("case " << ci);
    kv::BlockTable table(16);
    table.ensure_capacity(cache.blocks(), static_cast<std::int32_t>(c.prompt_ids.size()));
    Tensor logits = model->forward(prefill_batch(c.prompt_ids, table, c.logit_positions), cache);
    std::vector<float> got(static_cast<std::size_t>(logits.numel()));
    backend->download(got.data(), logits);
    table.release(cache.blocks());
    const TensorInfo* want = golden.find(fmt::format("logits.{}", ci));
    REQUIRE(want);
    REQUIRE(want->shape == logits.shape);
    const auto* ref = reinterpret_cast<const float*>(want->data);
    for (std::size_t r = 0; r < c.logit_positions.size(); ++r) {
      const auto [diff, scale] = test::row_error(got.data(), ref, r, vocab);
      INFO("row " << r << ": max diff " << diff << ", max |hf| " << scale);
      CHECK(diff <= (f32 ? 1e-4f : 5e-2f) * scale);
    }
  }
  Engine engine(*model, nullptr);
  auto results = generate(engine, test::greedy_requests(cases));
  std::size_t same = 0, total = 0;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    for (std::size_t i = 0; i < cases[ci].greedy_ids.size() && i < results[ci].tokens.size(); ++i, ++total) {
      if (results[ci].tokens[i] != cases[ci].greedy_ids[i]) break;
      ++same;
    }
    if (f32) CHECK(results[ci].tokens == cases[ci].greedy_ids);
  }
  if (!f32) WARN("bf16 greedy: " << same << " of " << total << " leading tokens equal HF's f32 run");
}

// Prefills `prompt` into a fresh cache, then decodes `steps` one-row steps, eagerly or replayed
// from the CUDA graph recorded under `key`; step s's input id is next(s, the logits before it: the
// prefill's for step 0). Returns every decode step's logits.
std::vector<std::vector<float>> decode_steps(
    Backend& backend, Model& model, const std::vector<std::int32_t>& prompt, std::int32_t steps,
    bool graphs, std::uint64_t key, const std::function<std::int32_t(std::int32_t, const Tensor&)>& next) {
  const std::int64_t vocab = model.config().vocab_size;
  kv::KvCache cache(backend, model.kv_spec(), {16, 8, 0});
  kv::BlockTable table(16);
  const auto n = static_cast<std::int32_t>(prompt.size());
  table.ensure_capacity(cache.blocks(), n + steps);
  Tensor out = model.forward(prefill_batch(prompt, table, {n - 1}), cache), recorded;
  std::vector<std::vector<float>> logits;
  for (std::int32_t step = 0; step < steps; ++step) {
    const DeviceBatch db = backend.upload_batch(decode_batch(next(step, out), n + step, table));
    if (graphs) {
      out = {};
      backend.run_graph(key, [&] { out = model.forward(db, cache); });
      if (out.empty()) out = recorded;
      else recorded = out;
    } else {
      out = model.forward(db, cache);
    }
    logits.emplace_back(static_cast<std::size_t>(vocab));
    backend.download(logits.back().data(), out);
  }
  return logits;
}

}  // namespace

TEST_CASE("cuda: tiny GPT-2 and Qwen3 fixtures match transformers", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  for (const char* name : {"tiny-gpt2", "tiny-qwen3", "tiny-qwen3-tied", "tiny-qwen3-bf16"}) {
    const std::string d = std::string(XSERV_TEST_DATA_DIR "/models/") + name;
    check_golden(d, d);
  }
  check_golden(XSERV_SOURCE_DIR "/examples/models/shakespeare", XSERV_TEST_DATA_DIR "/models/shakespeare");
}

TEST_CASE("cuda: decode steps replayed from a CUDA graph equal eager steps", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  for (const char* name : {"tiny-gpt2", "tiny-qwen3"}) {
    INFO(name);
    const std::string dir = std::string(XSERV_TEST_DATA_DIR "/models/") + name;
    auto backend = cuda::make_cuda_backend({});
    auto model = Model::load(dir, *backend, {});
    SamplingBatch greedy;
    greedy.rows.resize(1);
    greedy.rows[0].temperature = 0.0f;
    const auto sampled = [&](std::int32_t, const Tensor& logits) {
      std::int32_t id = 0;
      backend->sample(logits, greedy, &id);
      return id;
    };
    const std::vector<std::int32_t> prompt = {5, 17, 3, 99, 42, 7, 8};
    const auto eager = decode_steps(*backend, *model, prompt, 12, false, 7, sampled);
    const auto replayed = decode_steps(*backend, *model, prompt, 12, true, 7, sampled);
    REQUIRE(eager.size() == replayed.size());
    for (std::size_t s = 0; s < eager.size(); ++s) {
      INFO("step " << s);
      REQUIRE(replayed[s] == eager[s]);
    }
  }
}

// Batched decode past the skinny kernel's rows takes gemm_rms_norm_gemm's K parts and the one
// sum + residual + RMSNorm kernel (XSERV_CUDA_RESID_SPLITS, read when a backend is made): a bf16
// Qwen3 of dummy weights whose hidden size that kernel takes (256), 40 sequences prefilled at
// once (240 rows) and decoded 4 steps (40 rows), against the separate ops (splits 0): logits
// within the bf16 tolerance of the golden tests; and the same steps replayed from a CUDA graph
// equal to the eager ones, bit for bit.
TEST_CASE("cuda: batched Qwen3 decode with the residual GEMM in K parts matches the separate ops", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  test::TempDir tmp;
  tmp.write("config.json", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 500, "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 768,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": false, "hidden_act": "silu", "torch_dtype": "bfloat16"})");
  constexpr std::int32_t seqs = 40, prompt_len = 6, steps = 4;
  // [backend][pass]: logits of every step, the prefill's last rows first.
  std::vector<std::vector<float>> got[2][2];
  for (int fused = 0; fused < 2; ++fused) {
    const ScopedEnv splits("XSERV_CUDA_RESID_SPLITS", fused ? "2" : "0");
    auto backend = cuda::make_cuda_backend({});
    ModelOptions mo;
    mo.dummy_weights = true;
    mo.max_batch_tokens = 256;
    auto model = Model::load(tmp.path().string(), *backend, mo);
    const std::int64_t vocab = model->config().vocab_size;
    for (int pass = 0; pass < (fused ? 2 : 1); ++pass) {  // fused: eager, then graph replays
      kv::KvCache cache(*backend, model->kv_spec(), {16, 2 * seqs + 2, 0, false});
      std::vector<kv::BlockTable> tables(seqs, kv::BlockTable(16));
      for (auto& t : tables) t.ensure_capacity(cache.blocks(), prompt_len + steps);
      const auto batch = [&](std::int32_t rows_each, std::int32_t first_pos, std::int32_t salt) {
        ForwardBatch b;
        b.query_start = {0};
        std::int32_t width = 0;
        for (const auto& t : tables) width = std::max(width, static_cast<std::int32_t>(t.blocks().size()));
        b.max_blocks_per_seq = width;
        for (std::int32_t s = 0; s < seqs; ++s) {
          for (std::int32_t i = 0; i < rows_each; ++i) {
            const std::int32_t pos = first_pos + i;
            b.token_ids.push_back((s * 31 + pos * 7 + salt) % static_cast<std::int32_t>(vocab));
            b.positions.push_back(pos);
            b.slot_mapping.push_back(tables[static_cast<std::size_t>(s)].slot(pos));
          }
          b.query_start.push_back(b.query_start.back() + rows_each);
          b.context_lens.push_back(first_pos + rows_each);
          const auto& blocks = tables[static_cast<std::size_t>(s)].blocks();
          for (std::int32_t j = 0; j < width; ++j)
            b.block_tables.push_back(j < static_cast<std::int32_t>(blocks.size()) ? blocks[static_cast<std::size_t>(j)] : 0);
          b.logit_rows.push_back(b.query_start.back() - 1);
        }
        return b;
      };
      const auto keep = [&](const Tensor& logits) {
        std::vector<float> host(static_cast<std::size_t>(logits.numel()));
        backend->download(host.data(), logits);
        got[fused][pass].push_back(std::move(host));
      };
      keep(model->forward(batch(prompt_len, 0, 1), cache));
      Tensor recorded;
      for (std::int32_t step = 0; step < steps; ++step) {
        const DeviceBatch db = backend->upload_batch(batch(1, prompt_len + step, 2));
        Tensor out;
        if (pass == 1) {
          backend->run_graph(11, [&] { out = model->forward(db, cache); });
          if (out.empty()) out = recorded;
          else recorded = out;
        } else {
          out = model->forward(db, cache);
        }
        keep(out);
      }
    }
  }
  REQUIRE(got[0][0].size() == got[1][0].size());
  const std::int64_t vocab = 500;
  for (std::size_t s = 0; s < got[0][0].size(); ++s) {
    INFO("forward " << s << " (0: the prefill)");
    REQUIRE(got[1][1][s] == got[1][0][s]);  // graph replays equal eager steps
    for (std::size_t r = 0; r < static_cast<std::size_t>(seqs); ++r) {
      const auto [diff, scale] = test::row_error(got[1][0][s].data(), got[0][0][s].data(), r, vocab);
      INFO("row " << r << ": max diff " << diff << ", max |separate| " << scale);
      CHECK(diff <= 5e-2f * scale);
    }
  }
}

// Batch-1 decode with the whole MLP as one kernel (XSERV_CUDA_FUSED_MLP=1, read when a backend is
// made): a bf16 Qwen3 of dummy weights with Qwen3-0.6B's layer shape (hidden 1024, 3072
// intermediates, which the clustered kernel takes on an H100 or H200), 8 decode steps after a
// 7-token prompt, against the separate GEMVs: logits within the bf16 tolerance of the golden
// tests; graph replays equal eager steps bit for bit (the kernel is deterministic).
TEST_CASE("cuda: Qwen3 batch-1 decode with the MLP as one kernel matches the separate GEMVs", "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  test::TempDir tmp;
  tmp.write("config.json", R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 1000, "hidden_size": 1024, "num_hidden_layers": 3, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": true, "hidden_act": "silu", "torch_dtype": "bfloat16"})");
  const std::vector<std::int32_t> prompt = {5, 17, 3, 99, 42, 7, 8};
  // The input ids are fixed (not sampled), so both backends decode the same sequence.
  const auto next = [](std::int32_t step, const Tensor&) { return (step * 37 + 11) % 1000; };
  std::vector<std::vector<float>> separate, eager, replayed;
  for (int fused = 0; fused < 2; ++fused) {
    const ScopedEnv env("XSERV_CUDA_FUSED_MLP", fused ? "1" : "0");
    auto backend = cuda::make_cuda_backend({});
    ModelOptions mo;
    mo.dummy_weights = true;
    auto model = Model::load(tmp.path().string(), *backend, mo);
    if (fused == 0) {
      separate = decode_steps(*backend, *model, prompt, 8, false, 5, next);
      continue;
    }
    eager = decode_steps(*backend, *model, prompt, 8, false, 5, next);
    replayed = decode_steps(*backend, *model, prompt, 8, true, 5, next);
  }
  REQUIRE(eager.size() == separate.size());
  // Where the kernel applies (sm_90, at least 128 SMs: 16 clusters of 8) the f32 sums run in
  // another order than the separate GEMVs', so some logit differs: the kernel ran.
  int sm_count = 0, major = 0;
  REQUIRE(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  if (major == 9 && sm_count >= 128) CHECK(eager != separate);
  for (std::size_t s = 0; s < eager.size(); ++s) {
    INFO("step " << s);
    REQUIRE(replayed[s] == eager[s]);
    const auto [diff, scale] = test::row_error(eager[s].data(), separate[s].data(), 0, 1000);
    INFO("max diff " << diff << ", max |separate| " << scale);
    CHECK(diff <= 5e-2f * scale);
  }
}
