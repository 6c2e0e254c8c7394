// Model forward on the CPU backend without fixture files: dummy weights from tiny configs.
// Packed batches (several sequences, mixed prefill and decode, chunked prompts) must give the
// logits each sequence gets alone; loading errors must name the tensor or field at fault.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "models/tiny_models.hpp"
#include "support/temp_dir.hpp"

using namespace xserv;

namespace {

// One sequence's part of a batch: run tokens[computed, computed + n), logits for all of them.
struct Part {
  kv::BlockTable* table;
  const std::vector<std::int32_t>* tokens;
  std::int32_t computed;
  std::int32_t n;
};

// Runs one packed forward and returns the logits of every row, [T][V].
std::vector<std::vector<float>> run(Model& m, kv::KvCache& cache, const std::vector<Part>& parts) {
  ForwardBatch b;
  b.query_start.push_back(0);
  for (const auto& p : parts) {
    p.table->ensure_capacity(cache.blocks(), p.computed + p.n);
    b.max_blocks_per_seq =
        std::max(b.max_blocks_per_seq, static_cast<std::int32_t>(p.table->blocks().size()));
  }
  for (const auto& p : parts) {
    for (std::int32_t j = 0; j < p.n; ++j) {
      const std::int32_t pos = p.computed + j;
      b.logit_rows.push_back(b.num_tokens());
      b.token_ids.push_back((*p.tokens)[static_cast<std::size_t>(pos)]);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(p.table->slot(pos));
    }
    b.query_start.push_back(b.num_tokens());
    b.context_lens.push_back(p.computed + p.n);
    auto blocks = p.table->blocks();
    blocks.resize(static_cast<std::size_t>(b.max_blocks_per_seq), 0);
    b.block_tables.insert(b.block_tables.end(), blocks.begin(), blocks.end());
  }
  Tensor logits = m.forward(b, cache);
  const auto rows = static_cast<std::size_t>(logits.shape[0]);
  const auto vocab = static_cast<std::size_t>(logits.shape[1]);
  std::vector<float> flat(rows * vocab);
  m.backend().download(flat.data(), logits);
  std::vector<std::vector<float>> out(rows);
  for (std::size_t r = 0; r < rows; ++r)
    out[r].assign(flat.begin() + static_cast<std::ptrdiff_t>(r * vocab),
                  flat.begin() + static_cast<std::ptrdiff_t>((r + 1) * vocab));
  return out;
}

// Metric: max |a - b| <= tol * max |b| over the row.
void check_close(const std::vector<float>& a, const std::vector<float>& b, float tol) {
  REQUIRE(a.size() == b.size());
  float diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  INFO("max diff " << diff << ", max |b| " << scale);
  CHECK(scale > 0);
  CHECK(diff <= tol * scale);
}

std::vector<std::int32_t> tokens(std::int32_t n, std::int32_t salt, std::int32_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 7 + salt * 13 + 3) % vocab;
  return t;
}

void check_batching(const std::string& config_json) {
  test::TempDir dir;
  dir.write("config.json", config_json);
  auto backend = make_backend(DeviceKind::cpu, {2, 0});
  ModelOptions opts;
  opts.dummy_weights = true;
  opts.dummy_seed = 7;
  opts.max_batch_tokens = 64;
  auto model = Model::load(dir.path().string(), *backend, opts);
  const std::int32_t vocab = model->config().vocab_size;
  kv::KvCache cache(*backend, model->kv_spec(), {4, 32, 0});

  const auto a = tokens(5, 1, vocab), b = tokens(11, 2, vocab), c = tokens(1, 3, vocab);
  std::vector<std::vector<std::vector<float>>> alone;
  for (const auto* t : {&a, &b, &c}) {
    kv::BlockTable table(4);
    alone.push_back(run(*model, cache, {{&table, t, 0, static_cast<std::int32_t>(t->size())}}));
    table.release(cache.blocks());
  }
  const float tol = 1e-5f;

  SECTION("several sequences of different lengths in one forward") {
    kv::BlockTable ta(4), tb(4), tc(4);
    auto rows = run(*model, cache, {{&tb, &b, 0, 11}, {&tc, &c, 0, 1}, {&ta, &a, 0, 5}});
    REQUIRE(rows.size() == 17);
    for (std::size_t i = 0; i < 11; ++i) check_close(rows[i], alone[1][i], tol);
    check_close(rows[11], alone[2][0], tol);
    for (std::size_t i = 0; i < 5; ++i) check_close(rows[12 + i], alone[0][i], tol);
  }
  SECTION("prefill chunks mixed with decodes of other sequences") {
    kv::BlockTable ta(4), tb(4), tc(4);
    run(*model, cache, {{&ta, &a, 0, 4}});                       // a: prompt of 4
    auto r1 = run(*model, cache, {{&tb, &b, 0, 3}, {&ta, &a, 4, 1}});  // b chunk + a decode
    check_close(r1[3], alone[0][4], tol);
    for (std::size_t i = 0; i < 3; ++i) check_close(r1[i], alone[1][i], tol);
    auto r2 = run(*model, cache, {{&tc, &c, 0, 1}, {&tb, &b, 3, 6}});  // c prefill + b chunk
    check_close(r2[0], alone[2][0], tol);
    for (std::size_t i = 0; i < 6; ++i) check_close(r2[1 + i], alone[1][3 + i], tol);
    auto r3 = run(*model, cache, {{&tb, &b, 9, 1}});
    check_close(r3[0], alone[1][9], tol);
    auto r4 = run(*model, cache, {{&tb, &b, 10, 1}});
    check_close(r4[0], alone[1][10], tol);
  }
}

}  // namespace

TEST_CASE("GPT-2 packed batches give each sequence's logits alone", "[models]") {
  check_batching(test::tiny_gpt2_config());
}

TEST_CASE("Qwen3 (GQA, head_dim != hidden/heads) packed batches give each sequence's logits alone",
          "[models]") {
  check_batching(test::tiny_qwen3_config(false));
}

TEST_CASE("Qwen3 with tied embeddings loads dummy weights", "[models]") {
  test::TempDir dir;
  dir.write("config.json", test::tiny_qwen3_config(true));
  auto backend = make_backend(DeviceKind::cpu, {1, 0});
  ModelOptions opts;
  opts.dummy_weights = true;
  std::size_t last_done = 0, last_total = 0;
  opts.on_progress = [&](std::size_t done, std::size_t total) {
    CHECK(done >= last_done);
    last_done = done;
    last_total = total;
  };
  auto model = Model::load(dir.path().string(), *backend, opts);
  CHECK(last_done == last_total);
  CHECK(last_total == model->weight_bytes());
  CHECK(model->config().head_dim == 12);
  CHECK(model->kv_spec().num_kv_heads == 2);
}

TEST_CASE("Model::load reads a GPT-2 checkpoint with or without the transformer. prefix",
          "[models]") {
  auto backend = make_backend(DeviceKind::cpu, {1, 0});
  for (const std::string prefix : {"transformer.", ""}) {
    test::TempDir dir;
    dir.write("config.json", test::tiny_gpt2_config());
    dir.write("model.safetensors", test::tiny_gpt2_weights(prefix).file());
    auto model = Model::load(dir.path().string(), *backend);
    CHECK(model->config().num_layers == 2);
    CHECK(model->weight_dtype() == DType::f32);
    kv::KvCache cache(*backend, model->kv_spec(), {4, 8, 0});
    kv::BlockTable t(4);
    const auto toks = tokens(6, 0, 64);
    auto rows = run(*model, cache, {{&t, &toks, 0, 6}});
    CHECK(rows.size() == 6);
    CHECK(std::isfinite(rows[5][0]));
  }
}

TEST_CASE("Model::load errors name the tensor, the shapes or the field", "[models]") {
  auto backend = make_backend(DeviceKind::cpu, {1, 0});
  test::TempDir dir;
  auto expect = [&](ErrorCode code, std::vector<std::string> parts) {
    try {
      Model::load(dir.path().string(), *backend);
      FAIL("expected an error");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.code() == code);
      for (const auto& p : parts) CHECK_THAT(e.what(), Catch::Contains(p));
    }
  };

  SECTION("missing tensor") {
    auto w = test::tiny_gpt2_weights();
    w.entries.erase(std::remove_if(w.entries.begin(), w.entries.end(),
                                   [](const auto& e) { return e.name == "transformer.h.1.mlp.c_fc.bias"; }),
                    w.entries.end());
    dir.write("config.json", test::tiny_gpt2_config());
    dir.write("model.safetensors", w.file());
    expect(ErrorCode::format, {"transformer.h.1.mlp.c_fc.bias", "missing", "[64]"});
  }
  SECTION("mis-shaped tensor") {
    auto w = test::tiny_gpt2_weights();
    for (auto& e : w.entries)
      if (e.name == "transformer.h.0.attn.c_attn.weight") {
        e.shape = {48, 16};  // transposed: a Linear layout where Conv1D is expected
      }
    dir.write("config.json", test::tiny_gpt2_config());
    dir.write("model.safetensors", w.file());
    expect(ErrorCode::format, {"transformer.h.0.attn.c_attn.weight", "[48, 16]", "[16, 48]"});
  }
  SECTION("missing config field") {
    std::string cfg = test::tiny_gpt2_config();
    cfg.replace(cfg.find("\"n_embd\""), 8, "\"n_embx\"");
    dir.write("config.json", cfg);
    dir.write("model.safetensors", test::tiny_gpt2_weights().file());
    expect(ErrorCode::format, {"n_embd"});
  }
  SECTION("checkpoint with more layers than the config") {
    dir.write("config.json", test::tiny_gpt2_config());  // 2 layers
    dir.write("model.safetensors", test::tiny_gpt2_weights("transformer.", 64, 16, 3).file());
    expect(ErrorCode::format, {"config has 2 layers", "3 layers", "'h.N.'"});
  }
  SECTION("absurd layer count, refused before anything is sized from it") {
    // 1e6 layers used to allocate 3 GB of per-layer state before a tensor was looked at.
    dir.write("config.json", test::tiny_gpt2_config(64, 16, 1000000));
    dir.write("model.safetensors", test::tiny_gpt2_weights().file());
    expect(ErrorCode::format, {"config has 1000000 layers", "2 layers"});
  }
  SECTION("a layer index far past the config in a tensor name") {
    auto w = test::tiny_gpt2_weights();
    w.add_f32("transformer.h.99999999999.ln_1.weight", {1}, {1.0f});
    dir.write("config.json", test::tiny_gpt2_config());
    dir.write("model.safetensors", w.file());
    expect(ErrorCode::format, {"config has 2 layers"});
  }
  SECTION("Qwen3 checkpoint with more layers than the config") {
    auto w = test::tiny_gpt2_weights();
    w.add_f32("model.layers.7.mlp.up_proj.weight", {1}, {1.0f});
    dir.write("config.json", test::tiny_qwen3_config());
    dir.write("model.safetensors", w.file());
    expect(ErrorCode::format, {"config has 2 layers", "8 layers", "'layers.N.'"});
  }
  SECTION("unknown architecture") {
    dir.write("config.json", R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})");
    expect(ErrorCode::unsupported, {"llama", "gpt2", "qwen3"});
  }
  SECTION("no checkpoint") {
    dir.write("config.json", test::tiny_gpt2_config());
    expect(ErrorCode::not_found, {});
  }
  SECTION("no config") {
    expect(ErrorCode::not_found, {"config.json"});
  }
}

TEST_CASE("Model::check_tokenizer refuses ids past the embedding rows", "[models]") {
  auto backend = make_backend(DeviceKind::cpu, {1, 0});
  test::TempDir dir;
  dir.write("config.json", test::tiny_gpt2_config());
  dir.write("model.safetensors", test::tiny_gpt2_weights().file());
  auto model = Model::load(dir.path().string(), *backend);
  model->check_tokenizer(64, "tok.json");  // as many ids as rows
  model->check_tokenizer(10, "tok.json");  // padding rows are fine
  try {
    model->check_tokenizer(65, "tok.json");
    FAIL("accepted id 64 of a 64-row embedding");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::format);
    CHECK_THAT(e.what(), Catch::Contains("tok.json") && Catch::Contains("64 rows"));
  }
}

TEST_CASE("Model::forward rejects batches larger than its workspace or context", "[models]") {
  test::TempDir dir;
  dir.write("config.json", test::tiny_gpt2_config(64, 16, 1, 2, 16));
  auto backend = make_backend(DeviceKind::cpu, {1, 0});
  ModelOptions opts;
  opts.dummy_weights = true;
  opts.max_batch_tokens = 8;
  auto model = Model::load(dir.path().string(), *backend, opts);
  kv::KvCache cache(*backend, model->kv_spec(), {4, 16, 0});
  kv::BlockTable t(4);
  const auto toks = tokens(20, 0, 64);
  CHECK_THROWS_AS(run(*model, cache, {{&t, &toks, 0, 9}}), Error);  // 9 > 8 tokens
  try {
    run(*model, cache, {{&t, &toks, 12, 5}});  // context 17 > 16 positions
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("17"));
  }
  kv::KvCache wrong(*backend, kv::KvSpec{2, 2, 8, DType::f32}, {4, 4, 0});
  kv::BlockTable t2(4);
  CHECK_THROWS_AS(run(*model, wrong, {{&t2, &toks, 0, 2}}), Error);
}
