// Sampling, one logits row at a time (rows in parallel):
//   1. penalties: HF repetition penalty over the set of prompt + output tokens (logit > 0 ? / p
//      : * p), then OpenAI presence/frequency over output tokens with their counts;
//   2. temperature <= 0: argmax, the first maximum on ties (a vector kernel: NaN never wins);
//   3. logits / temperature, softmax; tokens in descending probability order (ties: lower id);
//   4. top-k, then top-p (HF: the smallest prefix whose mass reaches top_p of what top-k kept,
//      at least one token), then min-p (keep p >= min_p * p_max);
//   5. inverse CDF over the kept tokens in that order with u = sampling_uniform(seed, step).
// The CUDA backend implements the same steps, so a seed gives the same token on both.
//
// Only the head of the order is sorted: tokens with p >= p_max * 2^-20 first. When top-p, the
// draw and everything before them land inside that head (nearly always), the tail's order cannot
// change the result; otherwise the full vocabulary is sorted.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/tensor_checks.hpp"

namespace xserv::cpu {
namespace {

struct Candidate {
  float p;
  std::int32_t id;
};

bool before(const Candidate& a, const Candidate& b) { return a.p > b.p || (a.p == b.p && a.id < b.id); }

void apply_penalties(std::span<float> logits, const SamplingRow& row,
                     std::span<const std::int32_t> prompt, std::span<const std::int32_t> output,
                     std::vector<std::int32_t>& counts) {
  const bool repetition = row.repetition_penalty != 1.0f;
  const bool openai = row.presence_penalty != 0.0f || row.frequency_penalty != 0.0f;
  if (!repetition && !openai) return;
  const auto vocab = static_cast<std::int32_t>(logits.size());
  for (auto ids : {prompt, output})
    for (std::int32_t id : ids)
      XSERV_CHECK(id >= 0 && id < vocab, ErrorCode::invalid_argument,
                  "sample: history token {} is outside the vocabulary of {}", id, vocab);
  counts.assign(logits.size(), 0);
  if (repetition) {
    // counts marks tokens already penalised: each distinct token once.
    const float p = row.repetition_penalty;
    for (auto ids : {prompt, output})
      for (std::int32_t id : ids) {
        auto& seen = counts[static_cast<std::size_t>(id)];
        if (seen) continue;
        seen = 1;
        float& l = logits[static_cast<std::size_t>(id)];
        l = l > 0.0f ? l / p : l * p;
      }
    if (openai)
      for (auto ids : {prompt, output})
        for (std::int32_t id : ids) counts[static_cast<std::size_t>(id)] = 0;
  }
  if (openai) {
    for (std::int32_t id : output) ++counts[static_cast<std::size_t>(id)];
    for (std::int32_t id : output) {
      auto& c = counts[static_cast<std::size_t>(id)];
      if (c <= 0) continue;  // applied already
      logits[static_cast<std::size_t>(id)] -=
          row.frequency_penalty * static_cast<float>(c) + row.presence_penalty;
      c = 0;
    }
  }
}

}  // namespace

std::int32_t sample_row(std::span<float> logits, const SamplingRow& row,
                        std::span<const std::int32_t> prompt_tokens,
                        std::span<const std::int32_t> output_tokens, const KernelTable& kernels) {
  XSERV_CHECK(!logits.empty(), ErrorCode::invalid_argument, "sample: empty logits row");
  thread_local std::vector<std::int32_t> counts;
  thread_local std::vector<Candidate> cand;
  apply_penalties(logits, row, prompt_tokens, output_tokens, counts);
  const std::size_t vocab = logits.size();

  if (!(row.temperature > 0.0f))
    return static_cast<std::int32_t>(kernels.argmax(logits.data(), static_cast<std::int64_t>(vocab)));

  float max_l = -INFINITY;
  for (float& l : logits) {
    l /= row.temperature;
    max_l = std::max(max_l, l);
  }
  double total = 0.0;
  for (float& l : logits) {
    l = std::exp(l - max_l);  // unnormalised probability, max 1
    total += l;
  }

  // The head: every token within 2^-20 of the most likely one.
  constexpr float head_ratio = 0x1p-20f;
  cand.clear();
  for (std::size_t i = 0; i < vocab; ++i)
    if (logits[i] >= head_ratio) cand.push_back({logits[i], static_cast<std::int32_t>(i)});
  double head_mass = 0.0;
  for (const auto& c : cand) head_mass += c.p;
  const bool top_k = row.top_k > 0 && static_cast<std::size_t>(row.top_k) < vocab;
  const float u = sampling_uniform(row.seed, row.step);
  auto sort_all = [&] {
    cand.clear();
    for (std::size_t i = 0; i < vocab; ++i) cand.push_back({logits[i], static_cast<std::int32_t>(i)});
  };
  // Mass that top-k keeps (what top-p's fraction refers to) and the most the walk below can need.
  std::size_t kept = vocab;
  if (top_k) {
    kept = static_cast<std::size_t>(row.top_k);
    if (cand.size() < kept) sort_all();  // the k-th token lies in the tail
    std::nth_element(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(kept) - 1, cand.end(),
                     before);
    cand.resize(kept);
    total = 0.0;
    for (const auto& c : cand) total += c.p;
    std::sort(cand.begin(), cand.end(), before);
  } else {
    // The walk stops inside the top-p cut, or (no top-p) where the cumulative mass passes
    // u * total; the head decides it unless it could run past the head (1e-6: rounding).
    const double need = static_cast<double>(row.top_p < 1.0f ? row.top_p : u) * total;
    if (head_mass < need + 1e-6 * total || (row.min_p > 0.0f && row.min_p < head_ratio))
      sort_all();
    std::sort(cand.begin(), cand.end(), before);
  }
  std::size_t n = std::min(kept, cand.size());
  bool filtered = top_k;  // else the draw is over the whole vocabulary, tail included
  if (row.top_p < 1.0f) {
    filtered = true;
    const double cut = static_cast<double>(row.top_p) * total;
    double cum = 0.0;
    std::size_t keep = 0;
    while (keep < n) {
      cum += cand[keep].p;
      ++keep;
      if (cum >= cut) break;
    }
    n = std::max<std::size_t>(keep, 1);
  }
  if (row.min_p > 0.0f) {
    filtered = true;
    const float floor_p = row.min_p * cand[0].p;
    std::size_t keep = 1;
    while (keep < n && cand[keep].p >= floor_p) ++keep;
    n = keep;
  }
  double mass = 0.0;
  if (filtered) {
    for (std::size_t i = 0; i < n; ++i) mass += cand[i].p;
  } else {
    mass = total;
  }
  const double target = static_cast<double>(u) * mass;
  double cum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    cum += cand[i].p;
    if (cum > target) return cand[i].id;
  }
  return cand[n - 1].id;
}

void CpuBackend::sample(Tensor logits, const SamplingBatch& params, std::int32_t* out_ids) {
  constexpr const char* op = "sample";
  check_dtype(op, "logits", logits, DType::f32);
  XSERV_CHECK(logits.shape.rank() == 2 && logits.shape[1] > 0, ErrorCode::invalid_argument,
              "sample: logits has shape {}, expected [rows, vocab]", logits.shape);
  const std::int64_t rows = logits.shape[0], vocab = logits.shape[1];
  XSERV_CHECK(static_cast<std::int64_t>(params.rows.size()) == rows, ErrorCode::invalid_argument,
              "sample: {} sampling rows for logits of shape {}", params.rows.size(), logits.shape);
  XSERV_CHECK(out_ids != nullptr || rows == 0, ErrorCode::invalid_argument, "sample: out_ids is null");
  check_data(op, "logits", logits);
  auto history = [&](const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& start,
                     const char* what) {
    if (start.empty()) return;
    XSERV_CHECK(static_cast<std::int64_t>(start.size()) == rows + 1 && start.front() == 0 &&
                    start.back() <= static_cast<std::int32_t>(tokens.size()),
                ErrorCode::invalid_argument, "sample: {}_start has {} entries for {} rows", what,
                start.size(), rows);
    for (std::size_t i = 0; i + 1 < start.size(); ++i)
      XSERV_CHECK(start[i] <= start[i + 1], ErrorCode::invalid_argument,
                  "sample: {}_start is not monotone at row {}", what, i);
  };
  history(params.prompt_tokens, params.prompt_start, "prompt");
  history(params.output_tokens, params.output_start, "output");
  auto slice = [](const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& start,
                  std::size_t r) -> std::span<const std::int32_t> {
    if (start.empty()) return {};
    return std::span<const std::int32_t>(tokens).subspan(
        static_cast<std::size_t>(start[r]), static_cast<std::size_t>(start[r + 1] - start[r]));
  };
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r)
      out_ids[r] = sample_row(
          std::span<float>(logits.as<float>() + static_cast<std::int64_t>(r) * vocab,
                           static_cast<std::size_t>(vocab)),
          params.rows[r], slice(params.prompt_tokens, params.prompt_start, r),
          slice(params.output_tokens, params.output_start, r), *kernels_);
  });
  // The step's last op: until the next forward, idle threads poll only briefly.
  pool_.set_spin_us(idle_spin_us_);
}

std::uint64_t CpuBackend::sample_async(Tensor logits, const SamplingBatch& params, Tensor ids_out) {
  check_dtype("sample_async", "ids_out", ids_out, DType::i32);
  XSERV_CHECK(logits.shape.rank() == 2 && ids_out.numel() == logits.shape[0],
              ErrorCode::invalid_argument, "sample_async: ids_out {} for logits {}", ids_out.shape,
              logits.shape);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(logits.shape[0]));
  sample(logits, params, ids.data());
  if (!ids.empty()) std::copy(ids.begin(), ids.end(), ids_out.as<std::int32_t>());
  std::lock_guard lock(async_mutex_);
  const std::uint64_t ticket = next_ticket_++;
  async_ids_.emplace(ticket, std::move(ids));
  return ticket;
}

void CpuBackend::wait_sampled(std::uint64_t ticket, std::int32_t* out_ids) {
  std::vector<std::int32_t> ids;
  {
    std::lock_guard lock(async_mutex_);
    const auto it = async_ids_.find(ticket);
    XSERV_CHECK(it != async_ids_.end(), ErrorCode::invalid_argument,
                "wait_sampled: unknown ticket {}", ticket);
    ids = std::move(it->second);
    async_ids_.erase(it);
  }
  std::copy(ids.begin(), ids.end(), out_ids);
}

void CpuBackend::resolve_tokens(Tensor tokens, const Tensor& sampled) {
  check_dtype("resolve_tokens", "tokens", tokens, DType::i32);
  check_dtype("resolve_tokens", "sampled", sampled, DType::i32);
  std::int32_t* t = tokens.as<std::int32_t>();
  const std::int32_t* ids = sampled.as<std::int32_t>();
  const std::int64_t rows = sampled.numel();
  for (std::int64_t i = 0; i < tokens.numel(); ++i) {
    if (t[i] >= 0) continue;
    const std::int64_t row = -std::int64_t{t[i]} - 1;
    XSERV_CHECK(row < rows, ErrorCode::invalid_argument,
                "resolve_tokens: token {} refers to row {} of {} sampled ids", i, row, rows);
    t[i] = ids[row];
  }
}

float logprobs_row(std::span<const float> logits, std::int32_t id, std::int32_t top_n,
                   std::int32_t* top_ids, float* top_logprobs) {
  const auto vocab = static_cast<std::int32_t>(logits.size());
  XSERV_CHECK(id >= 0 && id < vocab, ErrorCode::invalid_argument,
              "logprobs: token {} is outside the vocabulary of {}", id, vocab);
  float max_l = -INFINITY;
  for (float l : logits) max_l = std::max(max_l, l);
  double total = 0.0;
  for (float l : logits) total += std::exp(static_cast<double>(l) - max_l);
  const float lse = max_l + static_cast<float>(std::log(total));
  thread_local std::vector<Candidate> cand;
  cand.clear();
  for (std::int32_t i = 0; i < vocab; ++i) cand.push_back({logits[static_cast<std::size_t>(i)], i});
  const auto n = static_cast<std::ptrdiff_t>(std::min(top_n, vocab));
  std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), before);
  for (std::ptrdiff_t k = 0; k < n; ++k) {
    top_ids[k] = cand[static_cast<std::size_t>(k)].id;
    top_logprobs[k] = cand[static_cast<std::size_t>(k)].p - lse;
  }
  for (std::ptrdiff_t k = n; k < top_n; ++k) {  // a vocabulary smaller than top_n
    top_ids[k] = -1;
    top_logprobs[k] = -INFINITY;
  }
  return logits[static_cast<std::size_t>(id)] - lse;
}

void CpuBackend::logprobs(const Tensor& logits, const std::int32_t* ids, std::int32_t top_n,
                          float* out_logprobs, std::int32_t* out_top_ids, float* out_top_logprobs) {
  constexpr const char* op = "logprobs";
  check_dtype(op, "logits", logits, DType::f32);
  XSERV_CHECK(logits.shape.rank() == 2 && logits.shape[1] > 0, ErrorCode::invalid_argument,
              "logprobs: logits has shape {}, expected [rows, vocab]", logits.shape);
  XSERV_CHECK(top_n >= 0 && top_n <= max_top_logprobs, ErrorCode::invalid_argument,
              "logprobs: top_n = {} (expected 0 ..= {})", top_n, max_top_logprobs);
  const std::int64_t rows = logits.shape[0], vocab = logits.shape[1];
  XSERV_CHECK(rows == 0 || (ids && out_logprobs && (top_n == 0 || (out_top_ids && out_top_logprobs))),
              ErrorCode::invalid_argument, "logprobs: a null pointer");
  check_data(op, "logits", logits);
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) {
      const std::size_t at = r * static_cast<std::size_t>(top_n);
      out_logprobs[r] = logprobs_row(
          std::span<const float>(logits.as<float>() + static_cast<std::int64_t>(r) * vocab,
                                 static_cast<std::size_t>(vocab)),
          ids[r], top_n, out_top_ids + at, out_top_logprobs + at);
    }
  });
}

}  // namespace xserv::cpu
