// Reading the Hugging Face golden fixtures (tests/data/models/*/golden.json, made by
// tests/reference/make_model_fixtures.py) and building the one-sequence prefill and decode
// batches that the parity tests of every backend (and tests/cuda/logits_dump) run.
#pragma once

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/batch.hpp"
#include "core/mapped_file.hpp"
#include "engine/generate.hpp"
#include "io/json.hpp"
#include "kv/block_pool.hpp"

namespace xserv::test {

struct GoldenCase {
  std::vector<std::int32_t> prompt_ids, logit_positions, greedy_ids;
};

inline std::vector<std::int32_t> golden_ints(simdjson::dom::element e) {
  std::vector<std::int32_t> out;
  for (auto v : e.get_array()) out.push_back(static_cast<std::int32_t>(v.get_int64().value()));
  return out;
}

inline std::vector<GoldenCase> read_golden_cases(const std::string& path) {
  simdjson::dom::parser parser;
  const std::string text = read_file(path);
  auto root = json::parse(parser, text, path);
  std::vector<GoldenCase> cases;
  for (auto c : root["cases"].get_array())
    cases.push_back({golden_ints(c["prompt_ids"]), golden_ints(c["logit_positions"]),
                     golden_ints(c["greedy_ids"])});
  return cases;
}

// Row r of two [rows, vocab] logits arrays: max |got - ref| and max |ref|, the terms of the
// parity metric (diff <= tolerance * scale).
struct RowError {
  float diff = 0, scale = 0;
};
inline RowError row_error(const float* got, const float* ref, std::size_t r, std::int64_t vocab) {
  RowError e;
  for (std::int64_t v = 0; v < vocab; ++v) {
    const std::size_t i = r * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(v);
    e.diff = std::max(e.diff, std::fabs(got[i] - ref[i]));
    e.scale = std::max(e.scale, std::fabs(ref[i]));
  }
  return e;
}

// The whole prompt as one sequence at positions 0.., its K/V going to `table`'s slots.
inline ForwardBatch prefill_batch(const std::vector<std::int32_t>& prompt,
                                  const kv::BlockTable& table,
                                  const std::vector<std::int32_t>& logit_rows) {
  ForwardBatch b;
  const auto n = static_cast<std::int32_t>(prompt.size());
  b.token_ids = prompt;
  for (std::int32_t i = 0; i < n; ++i) {
    b.positions.push_back(i);
    b.slot_mapping.push_back(table.slot(i));
  }
  b.query_start = {0, n};
  b.context_lens = {n};
  b.block_tables = table.blocks();
  b.max_blocks_per_seq = static_cast<std::int32_t>(table.blocks().size());
  b.logit_rows = logit_rows;
  return b;
}

// One token of the sequence at position `pos` (a decode step), its K/V going to `table`'s slot.
inline ForwardBatch decode_batch(std::int32_t token, std::int32_t pos, const kv::BlockTable& table) {
  ForwardBatch b;
  b.token_ids = {token};
  b.positions = {pos};
  b.slot_mapping = {table.slot(pos)};
  b.query_start = {0, 1};
  b.context_lens = {pos + 1};
  b.block_tables = table.blocks();
  b.max_blocks_per_seq = static_cast<std::int32_t>(table.blocks().size());
  b.logit_rows = {0};
  return b;
}

// One greedy request per case, as long as its HF continuation, eos ignored as HF's runs were.
inline std::vector<GenerationRequest> greedy_requests(const std::vector<GoldenCase>& cases) {
  std::vector<GenerationRequest> reqs;
  for (const auto& c : cases) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = static_cast<std::int32_t>(c.greedy_ids.size());
    p.ignore_eos = true;
    reqs.push_back({c.prompt_ids, p});
  }
  return reqs;
}

}  // namespace xserv::test
