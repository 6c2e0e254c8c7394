// Tiny model configs (and checkpoints) written by tests: real architectures at toy sizes, so a
// model test needs no fixture files and runs in milliseconds under ASan.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/safetensors_writer.hpp"

namespace xserv::test {

inline std::string tiny_gpt2_config(int vocab = 64, int d = 16, int layers = 2, int heads = 2,
                                    int n_positions = 64) {
  return fmt::format(R"({{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
    "vocab_size": {}, "n_embd": {}, "n_layer": {}, "n_head": {}, "n_positions": {},
    "n_inner": null, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
    "eos_token_id": 0, "bos_token_id": 0, "torch_dtype": "float32"}})",
                     vocab, d, layers, heads, n_positions);
}

// GQA (4 q heads over 2 kv heads) and head_dim 12 != hidden / heads.
inline std::string tiny_qwen3_config(bool tied = false, int vocab = 64, int max_pos = 64) {
  return fmt::format(R"({{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": {}, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 12, "intermediate_size": 40,
    "max_position_embeddings": {}, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": {}, "hidden_act": "silu", "eos_token_id": 1, "torch_dtype": "float32"}})",
                     vocab, max_pos, tied ? "true" : "false");
}

// The tensors of tiny_gpt2_config() with deterministic values; `prefix` is "transformer." or "".
inline SafetensorsWriter tiny_gpt2_weights(const std::string& prefix = "transformer.",
                                           int vocab = 64, int d = 16, int layers = 2,
                                           int n_positions = 64) {
  SafetensorsWriter w;
  std::uint32_t state = 12345;
  auto values = [&](std::int64_t n, float base) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) {
      state = state * 1664525u + 1013904223u;
      x = base + 0.05f * (static_cast<float>(state >> 8) / 16777216.0f - 0.5f);
    }
    return v;
  };
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, float base = 0.0f) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    w.add_f32(prefix + name, shape, values(n, base));
  };
  add("wte.weight", {vocab, d});
  add("wpe.weight", {n_positions, d});
  for (int i = 0; i < layers; ++i) {
    const std::string n = fmt::format("h.{}.", i);
    add(n + "ln_1.weight", {d}, 1.0f);
    add(n + "ln_1.bias", {d});
    add(n + "attn.c_attn.weight", {d, 3 * d});
    add(n + "attn.c_attn.bias", {3 * d});
    add(n + "attn.c_proj.weight", {d, d});
    add(n + "attn.c_proj.bias", {d});
    add(n + "ln_2.weight", {d}, 1.0f);
    add(n + "ln_2.bias", {d});
    add(n + "mlp.c_fc.weight", {d, 4 * d});
    add(n + "mlp.c_fc.bias", {4 * d});
    add(n + "mlp.c_proj.weight", {4 * d, d});
    add(n + "mlp.c_proj.bias", {d});
  }
  add("ln_f.weight", {d}, 1.0f);
  add("ln_f.bias", {d});
  return w;
}

}  // namespace xserv::test
