// GPT-2 (124M to 1.5B shapes): learned positions, pre-LayerNorm blocks, fused QKV Conv1D
// ([in, out] weights, transposed at load to [out, in] unless Model::conv1d_layout says to keep
// them), gelu_new MLP, lm_head tied to the token embedding.
//
// HF checkpoints name tensors `transformer.h.N.attn.c_attn.weight`; older exports drop the
// `transformer.` prefix, and both are accepted.
//
// Tensor parallel (Shard, docs/parallel.md): c_attn is column-parallel (each rank loads its
// heads' columns of q, of k and of v: three ranges of the fused [d, 3d] weight) and c_fc too;
// attn.c_proj and mlp.c_proj are row-parallel (their rows), with their bias on rank 0 only, and
// write into x with residual_beta() before one all_reduce(x) each.
#include <cmath>

#include "core/error.hpp"
#include "models/model_registry.hpp"

namespace xserv {

namespace {

class Gpt2 final : public Model {
 public:
  Gpt2(const ModelConfig& c, const std::string& dir, Backend& b) : Model(c, dir, b) {}

  struct Layer {
    Tensor ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b;
    Tensor ln2_w, ln2_b, fc_w, fc_b, fc_proj_w, fc_proj_b;
  };
  Tensor wte, wpe, lnf_w, lnf_b, lm_head;
  std::vector<Layer> layers;
  HeadGeometry heads;
  WeightLayout conv = WeightLayout::in_out;  // of the four Conv1D weights of every layer
  // Workspace: residual stream x, normed h, packed qkv, attention output, MLP hidden, and the
  // head's gathered rows, their norm and the logits.
  Tensor x, h, qkv, attn, mlp, rows, rows_normed, logits;

  static std::unique_ptr<Model> create(const ModelConfig& config, const std::string& dir,
                                       Backend& backend, WeightLoader& weights,
                                       const ModelOptions& options) {
    XSERV_CHECK(config.activation == "gelu_new" || config.activation == "gelu_pytorch_tanh",
                ErrorCode::unsupported,
                "{}/config.json: activation_function '{}' is not supported (gelu_new)", dir,
                config.activation);
    XSERV_CHECK(config.num_kv_heads == config.num_heads &&
                    config.head_dim * config.num_heads == config.hidden_size,
                ErrorCode::format, "{}/config.json: GPT-2 needs head_dim x n_head == n_embd", dir);
    auto m = std::make_unique<Gpt2>(config, dir, backend);
    m->set_limits(options);
    m->heads = HeadGeometry{m->shard_.q_heads, m->shard_.q_heads, config.head_dim};
    m->declare(weights);
    m->weight_bytes_ = weights.load(options.on_progress);
    m->weight_dtype_ = m->wte.dtype;
    m->conv = m->conv1d_layout();
    if (m->conv == WeightLayout::panel32) {
      // The panels hold whole 32-column runs of f32 weights (the GEMM multiplies them in place).
      bool fits = true;
      for (const Layer& l : m->layers)
        for (const Tensor* w : {&l.attn_w, &l.proj_w, &l.fc_w, &l.fc_proj_w})
          fits = fits && w->dtype == DType::f32 && w->shape[1] % weight_panel_width == 0;
      if (!fits) m->conv = WeightLayout::out_in;
    }
    if (m->conv != WeightLayout::in_out)
      for (Layer& l : m->layers)
        for (Tensor* w : {&l.attn_w, &l.proj_w, &l.fc_w, &l.fc_proj_w})
          *w = m->conv == WeightLayout::panel32 ? m->pack_panels(*w) : m->transpose_in_out(*w);
    m->plan();
    return m;
  }

  void declare(WeightLoader& w) {
    const auto& c = config_;
    const Shard& s = shard_;
    const std::int64_t d = c.hidden_size, inner = c.intermediate_size;
    // This rank's heads: the same columns of q, k and v in c_attn ([d, 3d], in_out), the same
    // rows of attn.c_proj; its inner block: columns of c_fc, rows of mlp.c_proj.
    const std::int64_t hb = s.q_head_begin * c.head_dim, hw = s.q_heads * c.head_dim;
    const Slice qkv_cols{1, {{hb, hw}, {d + hb, hw}, {2 * d + hb, hw}}};
    const Slice qkv_bias{0, qkv_cols.ranges};
    const Slice head_rows = Slice::rows(hb, hw);
    const Slice inner_cols = Slice::cols(s.inner_begin, s.inner);
    const Slice inner_rows = Slice::rows(s.inner_begin, s.inner);
    const std::string p = w.has("wte.weight") && !w.has("transformer.wte.weight") ? "" : "transformer.";
    auto names = [&](const std::string& n) { return std::vector<std::string>{p + n}; };
    w.require(&wte, names("wte.weight"), {c.vocab_size, d});
    w.require(&wpe, names("wpe.weight"), {c.max_position_embeddings, d});
    layers.resize(static_cast<std::size_t>(c.num_layers));
    for (std::int32_t i = 0; i < c.num_layers; ++i) {
      Layer& l = layers[static_cast<std::size_t>(i)];
      const std::string n = fmt::format("h.{}.", i);
      w.require(&l.ln1_w, names(n + "ln_1.weight"), {d}, DummyInit::ones);
      w.require(&l.ln1_b, names(n + "ln_1.bias"), {d}, DummyInit::bias);
      w.require(&l.attn_w, names(n + "attn.c_attn.weight"), {d, 3 * d}, DummyInit::normal, qkv_cols);
      w.require(&l.attn_b, names(n + "attn.c_attn.bias"), {3 * d}, DummyInit::bias, qkv_bias);
      w.require(&l.proj_w, names(n + "attn.c_proj.weight"), {d, d}, DummyInit::normal, head_rows);
      if (s.leader()) w.require(&l.proj_b, names(n + "attn.c_proj.bias"), {d}, DummyInit::bias);
      w.require(&l.ln2_w, names(n + "ln_2.weight"), {d}, DummyInit::ones);
      w.require(&l.ln2_b, names(n + "ln_2.bias"), {d}, DummyInit::bias);
      w.require(&l.fc_w, names(n + "mlp.c_fc.weight"), {d, inner}, DummyInit::normal, inner_cols);
      w.require(&l.fc_b, names(n + "mlp.c_fc.bias"), {inner}, DummyInit::bias, inner_rows);
      w.require(&l.fc_proj_w, names(n + "mlp.c_proj.weight"), {inner, d}, DummyInit::normal,
                inner_rows);
      if (s.leader()) w.require(&l.fc_proj_b, names(n + "mlp.c_proj.bias"), {d}, DummyInit::bias);
    }
    if (!s.leader()) return;  // the head lives on rank 0 only
    w.require(&lnf_w, names("ln_f.weight"), {d}, DummyInit::ones);
    w.require(&lnf_b, names("ln_f.bias"), {d}, DummyInit::bias);
    if (!c.tie_word_embeddings) w.require(&lm_head, {"lm_head.weight"}, {c.vocab_size, d});
  }

  void plan() {
    const auto& c = config_;
    const DType act = activation_dtype();
    const std::int64_t t = max_batch_tokens_, d = c.hidden_size;
    const std::int64_t r = shard_.leader() ? max_logit_rows_ : 0;
    plan_workspace(&x, act, {t, d});
    plan_workspace(&h, act, {t, d});
    plan_workspace(&qkv, act, {t, heads.qkv_width()});
    plan_workspace(&attn, act, {t, static_cast<std::int64_t>(heads.n_q_heads) * c.head_dim});
    plan_workspace(&mlp, act, {t, shard_.inner});
    plan_workspace(&rows, act, {r, d});
    plan_workspace(&rows_normed, act, {r, d});
    plan_workspace(&logits, DType::f32, {r, c.vocab_size});
    allocate_workspace();
  }

  Tensor run(const DeviceBatch& b, kv::KvCache& cache) override {
    Backend& be = backend_;
    const auto& c = config_;
    const std::int64_t t = b.num_tokens, r = b.num_logit_rows;
    Tensor xt = x.rows(0, t), ht = h.rows(0, t), qkvt = qkv.rows(0, t), at = attn.rows(0, t),
           mt = mlp.rows(0, t);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const float beta = residual_beta();
    be.embedding(xt, b.token_ids, wte, wpe, b.positions);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      const KvLayer kvl = cache.layer(static_cast<std::int32_t>(i));
      be.layer_norm_gemm(qkvt, xt, l.ln1_w, l.ln1_b, c.norm_eps, l.attn_w, conv, l.attn_b, false, ht);
      be.qk_attention(at, qkvt, heads, QkTransform{}, b, kvl, scale);
      be.gemm(xt, at, l.proj_w, conv, l.proj_b, beta);  // x += attn · W + b
      all_reduce(xt);
      be.layer_norm_gemm(mt, xt, l.ln2_w, l.ln2_b, c.norm_eps, l.fc_w, conv, l.fc_b, true, ht);
      be.gemm(xt, mt, l.fc_proj_w, conv, l.fc_proj_b, beta);
      all_reduce(xt);
    }
    if (r == 0 || !shard_.leader()) return logits.rows(0, 0);
    Tensor rt = rows.rows(0, r), rn = rows_normed.rows(0, r), lt = logits.rows(0, r);
    // Logit rows are ascending and distinct: as many as the tokens (a decode step) are all of them.
    if (r == t) rt = xt;
    else be.gather_rows(rt, xt, b.logit_rows);
    be.layer_norm(rn, rt, {}, lnf_w, lnf_b, c.norm_eps);
    be.gemm(lt, rn, lm_head.empty() ? wte : lm_head, WeightLayout::out_in, {});
    return lt;
  }
};

}  // namespace

std::unique_ptr<Model> make_gpt2(const ModelConfig& config, const std::string& dir,
                                 Backend& backend, WeightLoader& weights,
                                 const ModelOptions& options) {
  return Gpt2::create(config, dir, backend, weights, options);
}

}  // namespace xserv
