// xserv_logits_dump: the logits and greedy continuation of prompts, for parity runs against
// Hugging Face (tests/reference/cuda_parity.py) on either backend.
//
//   xserv_logits_dump -m DIR --prompts FILE --out PREFIX [--device cpu|cuda] [--gen N] [--graphs]
//
// FILE holds one prompt per line as a JSON array of token ids. For each prompt: one prefill
// forward with every row's logits, then N greedy tokens (sampled on the backend), each fed back
// by a one-token decode forward (through Backend::run_graph with --graphs, so CUDA graphs are
// recorded and replayed). Writes PREFIX.f32: for each prompt, the f32 logits of its
// prompt_len + N - 1 positions, rows of vocab_size; PREFIX.json: {"vocab": V, "prompts":
// [{"prompt_len": T, "greedy": [ids]}]}.
#include <charconv>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "support/golden.hpp"

using namespace xserv;

namespace {

std::vector<std::vector<std::int32_t>> read_prompts(const std::string& path) {
  std::ifstream in(path);
  XSERV_CHECK(in.good(), ErrorCode::not_found, "cannot read {}", path);
  std::vector<std::vector<std::int32_t>> prompts;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::int32_t> ids;
    const char* p = line.data();
    const char* end = p + line.size();
    while (p < end) {
      if (*p >= '0' && *p <= '9') {
        std::int32_t v = 0;
        auto r = std::from_chars(p, end, v);
        ids.push_back(v);
        p = r.ptr;
      } else {
        ++p;
      }
    }
    if (!ids.empty()) prompts.push_back(std::move(ids));
  }
  return prompts;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir, prompts_path, out, device = "cuda";
  std::int32_t gen = 16;
  bool graphs = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      XSERV_CHECK(i + 1 < argc, ErrorCode::invalid_argument, "{} needs a value", a);
      return argv[++i];
    };
    if (a == "-m") dir = value();
    else if (a == "--prompts") prompts_path = value();
    else if (a == "--out") out = value();
    else if (a == "--device") device = value();
    else if (a == "--gen") gen = std::stoi(value());
    else if (a == "--graphs") graphs = true;
    else throw_error(ErrorCode::invalid_argument, "unknown option '{}'", a);
  }
  XSERV_CHECK(!dir.empty() && !prompts_path.empty() && !out.empty() && gen >= 1,
              ErrorCode::invalid_argument, "usage: -m DIR --prompts FILE --out PREFIX [--gen N]");
  const auto prompts = read_prompts(prompts_path);
  std::int32_t longest = 1;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<std::int32_t>(p.size()));

  auto backend = make_backend(device == "cpu" ? DeviceKind::cpu : DeviceKind::cuda);
  ModelOptions mo;
  mo.max_batch_tokens = longest;
  mo.max_logit_rows = longest;
  auto model = Model::load(dir, *backend, mo);
  const std::int64_t vocab = model->config().vocab_size;
  constexpr std::int32_t block_size = 16;
  kv::KvCacheOptions ko;
  ko.block_size = block_size;
  ko.num_blocks = (longest + gen) / block_size + 2;
  kv::KvCache cache(*backend, model->kv_spec(), ko);

  std::ofstream bin(out + ".f32", std::ios::binary);
  std::string json = "{\"vocab\": " + std::to_string(vocab) + ", \"backend\": \"" + backend->name() +
                     "\", \"prompts\": [";
  std::vector<float> host;
  Tensor decode_logits;  // a recorded decode step returns no tensor on replay: keep the first
  for (std::size_t pi = 0; pi < prompts.size(); ++pi) {
    const auto& prompt = prompts[pi];
    const auto t = static_cast<std::int32_t>(prompt.size());
    kv::BlockTable table(block_size);
    table.ensure_capacity(cache.blocks(), t + gen);
    std::vector<std::int32_t> every_row(static_cast<std::size_t>(t));
    for (std::int32_t p = 0; p < t; ++p) every_row[static_cast<std::size_t>(p)] = p;
    Tensor logits = model->forward(test::prefill_batch(prompt, table, every_row), cache);
    host.resize(static_cast<std::size_t>(logits.numel()));
    backend->download(host.data(), logits);
    bin.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.size() * 4));

    SamplingBatch greedy;
    greedy.rows.resize(1);
    greedy.rows[0].temperature = 0.0f;
    std::vector<std::int32_t> ids;
    std::int32_t id = 0;
    backend->sample(logits.rows(t - 1, 1), greedy, &id);
    ids.push_back(id);
    for (std::int32_t g = 1; g < gen; ++g) {
      const ForwardBatch d = test::decode_batch(id, t + g - 1, table);
      d.validate(block_size);
      const DeviceBatch db = backend->upload_batch(d);
      Tensor step;
      if (graphs) {
        backend->run_graph(1, [&] { step = model->forward(db, cache); });
        if (step.empty()) step = decode_logits;
        else decode_logits = step;
      } else {
        step = model->forward(db, cache);
      }
      host.resize(static_cast<std::size_t>(vocab));
      backend->download(host.data(), step);
      bin.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.size() * 4));
      backend->sample(step, greedy, &id);
      ids.push_back(id);
    }
    table.release(cache.blocks());
    json += std::string(pi ? ", " : "") + "{\"prompt_len\": " + std::to_string(t) + ", \"greedy\": [";
    for (std::size_t i = 0; i < ids.size(); ++i) json += (i ? ", " : "") + std::to_string(ids[i]);
    json += "]}";
  }
  json += "]}\n";
  std::ofstream(out + ".json") << json;
  std::printf("%s: %zu prompts on %s\n", out.c_str(), prompts.size(), backend->name().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "xserv_logits_dump: %s\n", e.what());
  return 1;
}
