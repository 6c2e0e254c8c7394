// qk_transform_store (per-head RMSNorm, neox RoPE, K/V into paged cache slots) and causal paged
// attention with grouped-query indexing.
//
// qkv rows are [q heads | k heads | v heads], each head_dim wide. The cache is
// [num_blocks, block_size, n_kv_heads, head_dim] f32; slot s is block s / block_size, offset
// s % block_size. Attention tasks are (row, kv head): the group of q heads that share a kv head
// read each cached K/V vector once; rows attend to keys at positions 0 ..= their own.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/tensor_checks.hpp"

namespace xserv::cpu {
namespace {

void check_geometry(const char* op, const HeadGeometry& h) {
  XSERV_CHECK(h.n_q_heads > 0 && h.n_kv_heads > 0 && h.head_dim > 0 &&
                  h.n_q_heads % h.n_kv_heads == 0,
              ErrorCode::invalid_argument,
              "{}: bad head geometry: {} q heads, {} kv heads, head_dim {}", op, h.n_q_heads,
              h.n_kv_heads, h.head_dim);
}

// The cache holds f32 or bf16 (CpuBackend::kv_dtype), K and V alike.
void check_cache(const char* op, const HeadGeometry& h, const KvLayer& c) {
  XSERV_CHECK((c.k.dtype == DType::f32 || c.k.dtype == DType::bf16) && c.v.dtype == c.k.dtype,
              ErrorCode::invalid_argument, "{}: cache k ({}) and v ({}) must both be f32 or bf16", op,
              dtype_name(c.k.dtype), dtype_name(c.v.dtype));
  XSERV_CHECK(c.k.shape.rank() == 4 && c.k.shape == c.v.shape && c.k.shape[2] == h.n_kv_heads &&
                  c.k.shape[3] == h.head_dim && c.k.shape[1] > 0,
              ErrorCode::invalid_argument,
              "{}: cache k {} / v {} must be [blocks, block_size, {}, {}]", op, c.k.shape,
              c.v.shape, h.n_kv_heads, h.head_dim);
  check_data(op, "cache.k", c.k);
  check_data(op, "cache.v", c.v);
}

void check_batch_vec(const char* op, const char* name, const Tensor& t, std::int64_t n) {
  check_dtype(op, name, t, DType::i32);
  XSERV_CHECK(t.numel() == n && (n == 0 || t.data), ErrorCode::invalid_argument,
              "{}: batch.{} has {} entries, expected {}", op, name, t.numel(), n);
}

// How many cache blocks ahead a decode row's task prefetches its K/V (AttentionTask::
// prefetch_blocks): XSERV_CPU_ATTN_PREFETCH=N, default 1, 0 none (the rule before 2026-12-02).
// Qwen3-0.6B at 8 threads on the GPU machine's Xeon (docs/benchmarks.md, issue 16, twelfth
// session; medians of interleaved runs): decode 56.3 tok/s with the guided GEMV split alone,
// 66.8 with this prefetch too; attention and qk_transform 1136 -> 779 us per step (one profile
// each, against main). 4 blocks ahead: no better (68.1 vs 68.3 tok/s, 4 runs each).
std::int32_t attention_prefetch_blocks() {
  static const std::int32_t blocks = [] {
    const char* v = std::getenv("XSERV_CPU_ATTN_PREFETCH");
    return v ? std::clamp(std::atoi(v), 0, 64) : 1;
  }();
  return blocks;
}

// XSERV_CPU_ATTN_SPLIT=claimed (read once; measurement): a prefill's (several row blocks')
// attention tasks claimed from the pool in order of decreasing key count, the kv heads split so
// that there are about 4 tasks per thread, instead of each thread's share dealt round-robin
// (attention()).
bool attention_claimed() {
  static const bool on = [] {
    const char* v = std::getenv("XSERV_CPU_ATTN_SPLIT");
    return v && std::string_view(v) == "claimed";
  }();
  return on;
}

// A one-row task's keys past this many (whole cache blocks; XSERV_CPU_ATTN_PART_KEYS=N, read
// once, default 512, 0 never) are split into parts of that many, each a task over all kv heads,
// merged after (FlashDecoding's split of the keys). A task over a range of kv heads reads a run
// of head_dim elements a slot apart, which DRAM serves slowly (Qwen3-0.6B's decode attention at
// 2048 keys: ~14 GB/s of the dev EPYC's 49 GB/s two-core ceiling, docs/benchmarks.md); a task over
// all heads streams each cache block whole, and long rows spread over the threads by keys. The
// parts depend on the row's key count alone, so a row's result does not change with the batch
// or the thread count.
std::int64_t attention_part_keys(std::int32_t block_size) {
  static const std::int64_t keys = [] {
    const char* v = std::getenv("XSERV_CPU_ATTN_PART_KEYS");
    return v ? std::max(0, std::atoi(v)) : 512;
  }();
  if (keys == 0) return std::numeric_limits<std::int64_t>::max();
  return std::max<std::int64_t>(1, keys / block_size) * block_size;
}

// A prefill's rows in tiles of a register's lanes (AttentionTask::lanes; XSERV_CPU_ATTN_LANES=0,
// read once, turns it off: the row-major kernel in blocks of 4 rows, as before 2026-12-07).
bool attention_lanes() {
  static const bool on = [] {
    const char* v = std::getenv("XSERV_CPU_ATTN_LANES");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// y = weight * (x * rsqrt(mean(x^2) + eps)) over one head, as HF's Qwen3RMSNorm in f32.
void rms_norm_head(float* x, const float* weight, std::int64_t d, float eps) {
  double ss = 0.0;
  for (std::int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
  for (std::int64_t i = 0; i < d; ++i) x[i] = weight[i] * (x[i] * inv);
}

// Neox rotation: the first and second halves of the head form the (re, im) pairs.
void rope_head(float* x, const float* cos_v, const float* sin_v, std::int64_t half) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos_v[i] - x2 * sin_v[i];
    x[i + half] = x2 * cos_v[i] + x1 * sin_v[i];
  }
}

}  // namespace

void CpuBackend::qk_transform_store(Tensor qkv, const HeadGeometry& heads, const QkTransform& tr,
                                    const DeviceBatch& batch, KvLayer cache) {
  constexpr const char* op = "qk_transform_store";
  check_geometry(op, heads);
  check_cache(op, heads, cache);
  check_dtype(op, "qkv", qkv, DType::f32);
  const std::int64_t t_count = batch.num_tokens, width = heads.qkv_width(), d = heads.head_dim;
  check_shape(op, "qkv", qkv, Shape{t_count, width});
  check_data(op, "qkv", qkv);
  check_batch_vec(op, "positions", batch.positions, t_count);
  check_batch_vec(op, "slot_mapping", batch.slot_mapping, t_count);
  for (const Tensor* nw : {&tr.q_norm, &tr.k_norm})
    if (!nw->empty()) {
      check_float(op, "q_norm/k_norm", *nw);
      check_shape(op, "q_norm/k_norm", *nw, Shape{d});
    }
  XSERV_CHECK(!tr.rope || d % 2 == 0, ErrorCode::invalid_argument,
              "{}: RoPE needs an even head_dim, got {}", op, d);
  const std::int64_t slots = cache.k.shape[0] * cache.k.shape[1];
  const auto* pos = batch.positions.as<const std::int32_t>();
  const auto* slot = batch.slot_mapping.as<const std::int32_t>();
  for (std::int64_t t = 0; t < t_count; ++t)
    XSERV_CHECK(slot[t] >= 0 && slot[t] < slots && pos[t] >= 0, ErrorCode::invalid_argument,
                "{}: row {} has slot {} (cache has {}) and position {}", op, t, slot[t], slots,
                pos[t]);

  // inv_freq[i] = 1 / theta^(2i / D), every step in f32 as HF's rotary embedding computes it;
  // kept from call to call, as are the cos/sin of the last one-row call's position: a decode step
  // of one sequence calls this once per layer at one position, and pow/cos/sin for 64 frequencies
  // took ~5 us of each call (Qwen3-0.6B, 28 layers).
  const std::int64_t half = d / 2;
  if (tr.rope && (rope_theta_ != tr.rope_theta || rope_d_ != d)) {
    rope_inv_freq_.resize(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      rope_inv_freq_[static_cast<std::size_t>(i)] =
          1.0f / std::pow(tr.rope_theta, static_cast<float>(2 * i) / static_cast<float>(d));
    rope_theta_ = tr.rope_theta;
    rope_d_ = d;
    rope_pos_ = -1;
  }
  const auto rope_table = [&](std::int32_t p, float* cos_v, float* sin_v) {
    for (std::int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * rope_inv_freq_[static_cast<std::size_t>(i)];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
  };
  const bool one_row = tr.rope && t_count == 1;
  if (one_row && rope_pos_ != pos[0]) {
    rope_cs_.resize(static_cast<std::size_t>(2 * half));
    rope_table(pos[0], rope_cs_.data(), rope_cs_.data() + half);
    rope_pos_ = pos[0];
  }
  const F32View qn(tr.q_norm), kn(tr.k_norm);
  const std::int64_t kv_row = static_cast<std::int64_t>(heads.n_kv_heads) * d;

  pool_.parallel_for(static_cast<std::size_t>(t_count), [&](std::size_t b, std::size_t e) {
    std::vector<float> cs(one_row ? 0 : static_cast<std::size_t>(2 * half));
    float* cos_v = one_row ? rope_cs_.data() : cs.data();
    float* sin_v = cos_v + half;
    for (std::size_t r = b; r < e; ++r) {
      float* row = qkv.as<float>() + static_cast<std::int64_t>(r) * width;
      if (tr.rope && !one_row) rope_table(pos[r], cos_v, sin_v);
      for (std::int32_t h = 0; h < heads.n_q_heads + heads.n_kv_heads; ++h) {
        float* x = row + h * d;
        const float* nw = h < heads.n_q_heads ? qn.get() : kn.get();
        if (nw) rms_norm_head(x, nw, d, tr.norm_eps);
        if (tr.rope) rope_head(x, cos_v, sin_v, half);
      }
      const float* k = row + static_cast<std::int64_t>(heads.n_q_heads) * d;
      const std::int64_t at = static_cast<std::int64_t>(slot[r]) * kv_row;
      if (cache.k.dtype == DType::bf16) {  // rounded to nearest even, as a bf16 model's own cache
        auto* kc = cache.k.as<std::uint16_t>() + at;
        auto* vc = cache.v.as<std::uint16_t>() + at;
        for (std::int64_t i = 0; i < kv_row; ++i) {
          kc[i] = f32_to_bf16(k[i]);
          vc[i] = f32_to_bf16(k[kv_row + i]);
        }
      } else {
        std::copy(k, k + kv_row, cache.k.as<float>() + at);
        std::copy(k + kv_row, k + 2 * kv_row, cache.v.as<float>() + at);
      }
    }
  }, 4);
}

void CpuBackend::attention(Tensor out, const Tensor& qkv, const HeadGeometry& heads,
                           const DeviceBatch& batch, const KvLayer& cache, float scale) {
  constexpr const char* op = "attention";
  check_geometry(op, heads);
  check_cache(op, heads, cache);
  check_dtype(op, "qkv", qkv, DType::f32);
  check_dtype(op, "out", out, DType::f32);
  const std::int64_t t_count = batch.num_tokens, s_count = batch.num_seqs, d = heads.head_dim;
  const std::int64_t width = heads.qkv_width(), q_width = heads.n_q_heads * d;
  check_shape(op, "qkv", qkv, Shape{t_count, width});
  check_shape(op, "out", out, Shape{t_count, q_width});
  check_data(op, "qkv", qkv);
  check_data(op, "out", out);
  check_batch_vec(op, "positions", batch.positions, t_count);
  check_batch_vec(op, "query_start", batch.query_start, s_count + 1);
  check_batch_vec(op, "context_lens", batch.context_lens, s_count);
  const std::int64_t max_blocks = batch.max_blocks_per_seq;
  check_batch_vec(op, "block_tables", batch.block_tables, s_count * max_blocks);
  const std::int32_t bs = cache.block_size();
  const std::int64_t num_blocks = cache.k.shape[0];
  const auto* qs = batch.query_start.as<const std::int32_t>();
  const auto* ctx = batch.context_lens.as<const std::int32_t>();
  const auto* pos = batch.positions.as<const std::int32_t>();
  const auto* tables = batch.block_tables.as<const std::int32_t>();

  // Every block a row may read is checked here, so the kernel can index without checks.
  std::vector<std::int32_t> row_seq(static_cast<std::size_t>(t_count));
  XSERV_CHECK(s_count == 0 || (qs[0] == 0 && qs[s_count] == t_count), ErrorCode::invalid_argument,
              "{}: query_start must run from 0 to {}", op, t_count);
  for (std::int64_t s = 0; s < s_count; ++s) {
    XSERV_CHECK(qs[s] <= qs[s + 1] && ctx[s] >= 0 && (ctx[s] + bs - 1) / bs <= max_blocks,
                ErrorCode::invalid_argument,
                "{}: sequence {} has rows [{}, {}) and a context of {} ({} blocks of {} allowed)",
                op, s, qs[s], qs[s + 1], ctx[s], max_blocks, bs);
    for (std::int64_t b = 0; b < (ctx[s] + bs - 1) / bs; ++b) {
      const std::int32_t blk = tables[s * max_blocks + b];
      XSERV_CHECK(blk >= 0 && blk < num_blocks, ErrorCode::invalid_argument,
                  "{}: sequence {} block {} is {}, outside the cache's {} blocks", op, s, b, blk,
                  num_blocks);
    }
    for (std::int32_t t = qs[s]; t < qs[s + 1]; ++t) {
      XSERV_CHECK(pos[t] >= 0 && pos[t] < ctx[s], ErrorCode::invalid_argument,
                  "{}: row {} has position {} outside its sequence's context of {}", op, t,
                  pos[t], ctx[s]);
      row_seq[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(s);
    }
  }

  const KernelTable& kt = *kernels_;
  const std::int32_t group = heads.n_q_heads / heads.n_kv_heads;
  // As many threads as there is K/V to read, at least min_parallel_bytes each: a short decode
  // context of a small model (tens of KB) runs faster on the calling thread than handed off.
  std::int64_t keys = 0;
  for (std::int64_t t = 0; t < t_count; ++t) keys += pos[t] + 1;
  const std::int64_t kv_bytes = keys * 2 * heads.n_kv_heads * d * static_cast<std::int64_t>(dtype_size(cache.k.dtype));
  const auto workers = std::clamp<std::int64_t>(kv_bytes / min_parallel_bytes(), 1,
                                                static_cast<std::int64_t>(pool_.size()));
  // Row blocks: up to 16 rows (4 without lanes) of one sequence at consecutive positions (a
  // prefill), which read each K/V block once for all of them (one row at a time, a 128-token
  // prefill read its whole cache once per row); a decode row is a block of its own.
  const bool lanes = attention_lanes();
  const std::int64_t block_rows = lanes ? 16 : 4;
  std::vector<std::int32_t> block_start;
  block_start.reserve(static_cast<std::size_t>(t_count));
  for (std::int64_t t = 0; t < t_count;) {
    std::int64_t e = t + 1;
    while (e < t_count && e - t < block_rows && row_seq[static_cast<std::size_t>(e)] ==
           row_seq[static_cast<std::size_t>(t)] && pos[e] == pos[e - 1] + 1)
      ++e;
    block_start.push_back(static_cast<std::int32_t>(t));
    t = e;
  }
  const auto n_blocks = static_cast<std::int64_t>(block_start.size());
  block_start.push_back(static_cast<std::int32_t>(t_count));
  // A one-row block over more than part_keys keys runs as key parts (attention_part_keys), each
  // writing its state to `partials` at part_at[blk] + part; other blocks as kv-head ranges.
  const std::int64_t part_keys = attention_part_keys(bs);
  const std::int64_t n_q = heads.n_q_heads, state = n_q * (d + 2);
  std::vector<std::int32_t> key_parts(static_cast<std::size_t>(n_blocks), 1);
  std::vector<std::int64_t> part_at(static_cast<std::size_t>(n_blocks), 0);
  std::int64_t n_parts = 0;
  for (std::int64_t blk = 0; blk < n_blocks; ++blk) {
    const std::int64_t t = block_start[static_cast<std::size_t>(blk)];
    const std::int64_t rows = block_start[static_cast<std::size_t>(blk) + 1] - t, keys_t = pos[t] + 1;
    if (rows != 1 || keys_t <= part_keys) continue;
    key_parts[static_cast<std::size_t>(blk)] = static_cast<std::int32_t>((keys_t + part_keys - 1) / part_keys);
    part_at[static_cast<std::size_t>(blk)] = n_parts;
    n_parts += key_parts[static_cast<std::size_t>(blk)];
  }
  std::vector<float> partials(static_cast<std::size_t>(n_parts * state));
  // One task: row block blk, the head_part-th of head_splits ranges of kv heads and, for a split
  // row, its key_part-th range of keys. Splitting heads changes no sum, so a split row's parts
  // are also split into head ranges when there are fewer parts than threads (the Xeon at 8
  // threads ran a 2048-key row's 4 parts on 4 of them, 9-19% slower than 8 one-head tasks).
  struct Task {
    std::int32_t blk, key_part, head_part, head_splits;
  };
  std::int64_t units = 0;  // tasks before head splits: a split row's parts, a block otherwise
  for (std::int32_t kp : key_parts) units += kp;
  const std::int64_t part_splits = std::clamp<std::int64_t>(
      (workers + units - 1) / std::max<std::int64_t>(units, 1), 1, heads.n_kv_heads);  // units 0: no rows
  const auto run_task = [&](const Task& task, std::vector<float>& scratch) {
    const auto blk = static_cast<std::size_t>(task.blk);
    const bool by_keys = key_parts[blk] > 1;
    const std::int64_t t = block_start[blk];
    const std::int64_t h = heads.n_kv_heads * task.head_part / task.head_splits;
    const std::int64_t h_end = heads.n_kv_heads * (task.head_part + 1) / task.head_splits;
    const std::int32_t s = row_seq[static_cast<std::size_t>(t)];
    AttentionTask at;
    at.q = qkv.as<const float>() + t * width + h * group * d;
    at.out = out.as<float>() + t * q_width + h * group * d;
    at.group = group;
    at.kv_heads = static_cast<std::int32_t>(h_end - h);
    at.head_dim = heads.head_dim;
    at.n_keys = pos[t] + 1;
    at.rows = block_start[blk + 1] - static_cast<std::int32_t>(t);
    at.q_row_stride = width;
    at.out_row_stride = q_width;
    at.block_table = tables + s * max_blocks;
    if (by_keys) {
      const std::int64_t k0 = task.key_part * part_keys;
      at.n_keys = static_cast<std::int32_t>(std::min(part_keys, pos[t] + 1 - k0));
      at.block_table += k0 / bs;
      at.partial = partials.data() + (part_at[blk] + task.key_part) * state + h * group * (d + 2);
    }
    at.block_size = bs;
    at.kv_dtype = cache.k.dtype;
    const std::int64_t head_offset = h * d * static_cast<std::int64_t>(dtype_size(cache.k.dtype));
    at.k_cache = static_cast<const char*>(cache.k.data) + head_offset;
    at.v_cache = static_cast<const char*>(cache.v.data) + head_offset;
    at.slot_stride = heads.n_kv_heads * d;
    at.scale = scale;
    at.prefetch_blocks = attention_prefetch_blocks();
    at.lanes = lanes;
    scratch.resize(static_cast<std::size_t>(attention_scratch_floats(at)));
    kt.attention(at, scratch.data());
  };
  // Block blk's tasks: its `splits` head ranges, or a split row's parts in part_splits each.
  const auto add_tasks = [&](std::vector<Task>& tasks, std::int32_t blk, std::int64_t splits) {
    const std::int32_t kp = key_parts[static_cast<std::size_t>(blk)];
    const auto hs = static_cast<std::int32_t>(kp > 1 ? part_splits : splits);
    for (std::int32_t k = 0; k < kp; ++k)
      for (std::int32_t h = 0; h < hs; ++h) tasks.push_back({blk, k, h, hs});
  };
  // Each split row's parts merged in part order: out = sum_p acc_p e^(m_p - m) / sum_p l_p
  // e^(m_p - m), m the largest m_p.
  const auto merge_parts = [&] {
    for (std::int64_t blk = 0; blk < n_blocks; ++blk) {
      const std::int32_t np = key_parts[static_cast<std::size_t>(blk)];
      if (np == 1) continue;
      const std::int64_t t = block_start[static_cast<std::size_t>(blk)];
      const float* st = partials.data() + part_at[static_cast<std::size_t>(blk)] * state;
      for (std::int64_t g = 0; g < n_q; ++g) {
        float* o = out.as<float>() + t * q_width + g * d;
        float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
        for (std::int32_t p = 0; p < np; ++p) m = std::max(m, st[p * state + g * (d + 2) + d]);
        std::fill(o, o + d, 0.0f);
        for (std::int32_t p = 0; p < np; ++p) {
          const float* sp = st + p * state + g * (d + 2);
          const float w = sp[d] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(sp[d] - m);
          l += sp[d + 1] * w;
          for (std::int64_t i = 0; i < d; ++i) o[i] += w * sp[i];
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (std::int64_t i = 0; i < d; ++i) o[i] *= inv;
      }
    }
  };
  const auto pool_threads = static_cast<std::int64_t>(pool_.size());
  if (attention_claimed() && n_blocks > 1 && workers == pool_threads) {
    // Claimed dynamically, the most keys first (a prefill's later rows see more keys), with
    // about 4 tasks per thread: a thread that starts late or runs slow leaves its tasks to the
    // others, and the last tasks are the shortest.
    std::vector<std::int32_t> order(static_cast<std::size_t>(n_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
      return pos[block_start[static_cast<std::size_t>(x)]] > pos[block_start[static_cast<std::size_t>(y)]];
    });
    const std::int64_t splits = std::clamp<std::int64_t>(
        (4 * workers + n_blocks - 1) / n_blocks, 1, heads.n_kv_heads);
    std::vector<Task> tasks;
    for (std::int32_t blk : order) add_tasks(tasks, blk, splits);
    pool_.parallel_for(tasks.size(), [&](std::size_t b, std::size_t e) {
      std::vector<float> scratch;
      for (std::size_t i = b; i < e; ++i) run_task(tasks[i], scratch);
    });
    merge_parts();
    return;
  }
  // Tasks are (row block, range of kv heads): all heads of a row in one task reads each cached
  // slot as one contiguous run, so blocks are split into head ranges only as far as needed to
  // give every thread work (decode of a few sequences); split rows' key parts.
  const std::int64_t splits =
      std::clamp<std::int64_t>((2 * workers + n_blocks - 1) / std::max<std::int64_t>(n_blocks, 1),
                               1, heads.n_kv_heads);
  std::vector<Task> tasks;
  for (std::int64_t blk = 0; blk < n_blocks; ++blk) add_tasks(tasks, static_cast<std::int32_t>(blk), splits);
  const auto n_tasks = static_cast<std::int64_t>(tasks.size());
  // Tasks are dealt round-robin: in a prefill later rows see more keys, so contiguous ranges
  // would leave the first threads idle.
  pool_.parallel_for(static_cast<std::size_t>(std::min(workers, n_tasks)),
                     [&](std::size_t b, std::size_t e) {
    std::vector<float> scratch;
    for (auto w = static_cast<std::int64_t>(b); w < static_cast<std::int64_t>(e); ++w)
      for (std::int64_t i = w; i < n_tasks; i += workers) run_task(tasks[static_cast<std::size_t>(i)], scratch);
  });
  merge_parts();
}

}  // namespace xserv::cpu
