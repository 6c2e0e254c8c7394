// Qwen3 dense (0.6B to 32B shapes): RMSNorm pre-norm blocks, separate q/k/v projections
// ([out, in] Linear weights, used as stored) writing column slices of one packed qkv buffer,
// per-head q/k RMSNorm + neox RoPE, grouped-query attention with an explicit head_dim (which may
// differ from hidden / heads), SwiGLU MLP, tied or untied lm_head.
//
// Tensor parallel (Shard, docs/parallel.md): q/k/v and gate/up are column-parallel (each rank
// loads its heads' rows and its inner rows), o_proj and down_proj row-parallel (its columns);
// each of the latter writes into x with residual_beta() and one all_reduce(x) follows, so the
// rest of the block (norms, the fused norm+GEMM) runs unchanged on the replicated x.
#include <cmath>
#include <initializer_list>

#include "core/error.hpp"
#include "models/model_registry.hpp"

namespace xserv {

namespace {

class Qwen3 final : public Model {
 public:
  Qwen3(const ModelConfig& c, const std::string& dir, Backend& b) : Model(c, dir, b) {}

  struct Layer {
    Tensor in_norm, q_w, k_w, v_w, q_b, k_b, v_b, q_norm, k_norm, o_w, post_norm;
    Tensor gate_w, up_w, down_w;
    // q|k|v and gate|up as single [rows, hidden] weights when they sit back to back in memory
    // (see stacked()); empty otherwise, and gemm_parts over the separate weights runs instead.
    Tensor qkv_w, gate_up_w;
  };
  Tensor embed, final_norm, lm_head;
  std::vector<Layer> layers;
  HeadGeometry heads;
  // Workspace: residual x, normed h, packed qkv [T, (hq + 2 hkv) * head_dim], attention output,
  // packed gate|up [T, 2I], SwiGLU output, and the head's rows, their norm and the logits.
  Tensor x, h, qkv, attn, gate_up, act, rows, rows_normed, logits;

  static std::unique_ptr<Model> create(const ModelConfig& config, const std::string& dir,
                                       Backend& backend, WeightLoader& weights,
                                       const ModelOptions& options) {
    XSERV_CHECK(config.activation == "silu", ErrorCode::unsupported,
                "{}/config.json: hidden_act '{}' is not supported (silu)", dir, config.activation);
    auto m = std::make_unique<Qwen3>(config, dir, backend);
    m->set_limits(options);
    m->heads = HeadGeometry{m->shard_.q_heads, m->shard_.kv_heads, config.head_dim};
    m->declare(weights);
    m->weight_bytes_ = weights.load(options.on_progress);
    m->weight_dtype_ = m->embed.dtype;
    for (Layer& l : m->layers) {
      if (l.q_b.empty() && l.k_b.empty() && l.v_b.empty()) l.qkv_w = stacked({&l.q_w, &l.k_w, &l.v_w});
      l.gate_up_w = stacked({&l.gate_w, &l.up_w});
    }
    m->plan();
    return m;
  }

  void declare(WeightLoader& w) {
    const auto& c = config_;
    const Shard& s = shard_;
    const std::int64_t d = c.hidden_size, inner = c.intermediate_size, hd = c.head_dim;
    const std::int64_t q_out = c.num_heads * hd, kv_out = c.num_kv_heads * hd;
    // This rank's rows of q (its heads), of k and v (its KV heads), of gate and up (its inner
    // block); o_proj and down_proj take the matching columns.
    const Slice q_rows = Slice::rows(s.q_head_begin * hd, s.q_heads * hd);
    const Slice kv_rows = Slice::rows(s.kv_head_begin * hd, s.kv_heads * hd);
    const Slice inner_rows = Slice::rows(s.inner_begin, s.inner);
    const Slice q_cols = Slice::cols(s.q_head_begin * hd, s.q_heads * hd);
    const Slice inner_cols = Slice::cols(s.inner_begin, s.inner);
    w.require(&embed, {"model.embed_tokens.weight"}, {c.vocab_size, d});
    layers.resize(static_cast<std::size_t>(c.num_layers));
    for (std::int32_t i = 0; i < c.num_layers; ++i) {
      Layer& l = layers[static_cast<std::size_t>(i)];
      const std::string n = fmt::format("model.layers.{}.", i);
      w.require(&l.in_norm, {n + "input_layernorm.weight"}, {d}, DummyInit::ones);
      w.require(&l.q_w, {n + "self_attn.q_proj.weight"}, {q_out, d}, DummyInit::normal, q_rows);
      w.require(&l.k_w, {n + "self_attn.k_proj.weight"}, {kv_out, d}, DummyInit::normal, kv_rows);
      w.require(&l.v_w, {n + "self_attn.v_proj.weight"}, {kv_out, d}, DummyInit::normal, kv_rows);
      w.adjacent({&l.q_w, &l.k_w, &l.v_w});  // one stacked q|k|v GEMV (stacked())
      // Qwen3 has no attention bias by default (attention_bias: false); honour one if present.
      w.optional(&l.q_b, {n + "self_attn.q_proj.bias"}, {q_out}, q_rows);
      w.optional(&l.k_b, {n + "self_attn.k_proj.bias"}, {kv_out}, kv_rows);
      w.optional(&l.v_b, {n + "self_attn.v_proj.bias"}, {kv_out}, kv_rows);
      w.require(&l.q_norm, {n + "self_attn.q_norm.weight"}, {hd}, DummyInit::ones);
      w.require(&l.k_norm, {n + "self_attn.k_norm.weight"}, {hd}, DummyInit::ones);
      w.require(&l.o_w, {n + "self_attn.o_proj.weight"}, {d, q_out}, DummyInit::normal, q_cols);
      w.require(&l.post_norm, {n + "post_attention_layernorm.weight"}, {d}, DummyInit::ones);
      w.require(&l.gate_w, {n + "mlp.gate_proj.weight"}, {inner, d}, DummyInit::normal, inner_rows);
      w.require(&l.up_w, {n + "mlp.up_proj.weight"}, {inner, d}, DummyInit::normal, inner_rows);
      w.adjacent({&l.gate_w, &l.up_w});
      w.require(&l.down_w, {n + "mlp.down_proj.weight"}, {d, inner}, DummyInit::normal, inner_cols);
    }
    if (!s.leader()) return;  // the head lives on rank 0 only
    w.require(&final_norm, {"model.norm.weight"}, {d}, DummyInit::ones);
    if (!c.tie_word_embeddings) w.require(&lm_head, {"lm_head.weight"}, {c.vocab_size, d});
  }

  void plan() {
    const auto& c = config_;
    const DType a = activation_dtype();
    const std::int64_t t = max_batch_tokens_, d = c.hidden_size;
    const std::int64_t r = shard_.leader() ? max_logit_rows_ : 0;
    plan_workspace(&x, a, {t, d});
    plan_workspace(&h, a, {t, d});
    plan_workspace(&qkv, a, {t, heads.qkv_width()});
    plan_workspace(&attn, a, {t, static_cast<std::int64_t>(heads.n_q_heads) * c.head_dim});
    plan_workspace(&gate_up, a, {t, 2 * shard_.inner});
    plan_workspace(&act, a, {t, shard_.inner});
    plan_workspace(&rows, a, {r, d});
    plan_workspace(&rows_normed, a, {r, d});
    plan_workspace(&logits, DType::f32, {r, c.vocab_size});
    allocate_workspace();
  }

  // One [sum of rows, cols] view of out_in weights that already lie back to back in memory, in
  // order; empty when they do not. A backend that copies weights (CUDA imports them in
  // declaration order into one arena) gives adjacent q/k/v and gate/up, so a decode step runs one
  // GEMV over the stacked weight instead of three (two) small ones, with the RMSNorm before it
  // and the SwiGLU after it fused in (rms_norm_gemm): fewer launches, no tail of a small grid.
  // Views into the mmap'd checkpoint (CPU) are adjacent only by chance; then the
  // separate weights go to gemm_parts (one pass of the CPU threads over all of them), with the
  // same result.
  static Tensor stacked(std::initializer_list<const Tensor*> parts) {
    const Tensor& first = **parts.begin();
    std::int64_t rows = 0;
    const auto* next = static_cast<const std::uint8_t*>(first.data);
    for (const Tensor* p : parts) {
      if (p->data != next || p->dtype != first.dtype || p->shape.rank() != 2 ||
          p->shape[1] != first.shape[1] || p->device != first.device)
        return {};
      rows += p->shape[0];
      next += p->bytes();
    }
    return Tensor(first.data, first.dtype, {rows, first.shape[1]}, first.device);
  }

  Tensor run(const DeviceBatch& b, kv::KvCache& cache) override {
    Backend& be = backend_;
    const auto& c = config_;
    const std::int64_t t = b.num_tokens, r = b.num_logit_rows;
    const std::int64_t hd = c.head_dim;
    const float beta = residual_beta();
    Tensor xt = x.rows(0, t), ht = h.rows(0, t), qkvt = qkv.rows(0, t), at = attn.rows(0, t),
           gu = gate_up.rows(0, t), actt = act.rows(0, t);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    be.embedding(xt, b.token_ids, embed, {}, {});
    // Without tensor parallelism (no all_reduce between them) a residual GEMM and the next
    // block's input side go to the backend as one op (gemm_rms_norm_gemm), which batched CUDA
    // decode runs with the residual sum and the RMSNorm in one kernel; qkv_done says the q|k|v of
    // layer i was computed that way by layer i - 1.
    const bool one_rank = shard_.size == 1;
    bool qkv_done = false;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      const KvLayer kvl = cache.layer(static_cast<std::int32_t>(i));
      if (!qkv_done && !l.qkv_w.empty()) {
        be.rms_norm_gemm(qkvt, xt, l.in_norm, c.norm_eps, l.qkv_w, false, ht, {});
      } else if (!qkv_done) {
        be.rms_norm(ht, xt, {}, l.in_norm, c.norm_eps);
        const Tensor ws[] = {l.q_w, l.k_w, l.v_w}, bs[] = {l.q_b, l.k_b, l.v_b};
        be.gemm_parts(qkvt, ht, ws, bs);
      }
      QkTransform qk{l.q_norm, l.k_norm, c.norm_eps, true, c.rope_theta};
      be.prefetch_next(l.o_w);
      be.qk_attention(at, qkvt, heads, qk, b, kvl, scale);
      // Where the backend runs the whole MLP as one kernel (CUDA at one decode row), the o_proj
      // and the MLP each stand alone, and the next layer's q|k|v starts from its own norm.
      if (one_rank && !l.gate_up_w.empty() && be.fuses_rms_norm_mlp(xt, l.gate_up_w, l.down_w)) {
        be.gemm(xt, at, l.o_w, WeightLayout::out_in, {}, beta);  // x += attn · Wo
        be.rms_norm_mlp(xt, l.post_norm, c.norm_eps, l.gate_up_w, l.down_w, actt, ht, gu);
        qkv_done = false;
        continue;
      }
      if (one_rank && !l.gate_up_w.empty()) {
        be.prefetch_next(l.down_w);
        be.gemm_rms_norm_gemm(xt, at, l.o_w, l.post_norm, c.norm_eps, l.gate_up_w, true, actt, ht, gu);
      } else {
        be.gemm(xt, at, l.o_w, WeightLayout::out_in, {}, beta);  // x += attn · Wo
        all_reduce(xt);
        if (!l.gate_up_w.empty()) {
          be.rms_norm_gemm(actt, xt, l.post_norm, c.norm_eps, l.gate_up_w, true, ht, gu);
        } else {
          be.rms_norm(ht, xt, {}, l.post_norm, c.norm_eps);
          const Tensor ws[] = {l.gate_w, l.up_w};
          be.gemm_parts(gu, ht, ws, {});
          be.swiglu(actt, gu);
        }
      }
      const Layer* next = i + 1 < layers.size() ? &layers[i + 1] : nullptr;
      qkv_done = one_rank && next != nullptr && !next->qkv_w.empty();
      if (qkv_done) {
        be.gemm_rms_norm_gemm(xt, actt, l.down_w, next->in_norm, c.norm_eps, next->qkv_w, false, qkvt, ht, {});
      } else {
        be.gemm(xt, actt, l.down_w, WeightLayout::out_in, {}, beta);  // x += mlp
        all_reduce(xt);
      }
    }
    if (r == 0 || !shard_.leader()) return logits.rows(0, 0);
    Tensor rt = rows.rows(0, r), rn = rows_normed.rows(0, r), lt = logits.rows(0, r);
    // Logit rows are ascending and distinct, so as many as the tokens are all of them (every
    // decode step): no gather. The final norm and the lm_head as one op, which CUDA runs as one
    // kernel at one row.
    if (r == t) rt = xt;
    else be.gather_rows(rt, xt, b.logit_rows);
    be.rms_norm_gemm(lt, rt, final_norm, c.norm_eps, lm_head.empty() ? embed : lm_head, false, rn, {});
    return lt;
  }
};

}  // namespace

std::unique_ptr<Model> make_qwen3(const ModelConfig& config, const std::string& dir,
                                  Backend& backend, WeightLoader& weights,
                                  const ModelOptions& options) {
  return Qwen3::create(config, dir, backend, weights, options);
}

}  // namespace xserv
