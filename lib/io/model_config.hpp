// config.json -> ModelConfig for the GPT-2 and Qwen3 families.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.hpp"

namespace xserv {

enum class ModelArch : std::uint8_t { gpt2, qwen3 };
std::string_view arch_name(ModelArch a) noexcept;

struct ModelConfig {
  ModelArch arch = ModelArch::gpt2;
  std::string model_type;  // as written in config.json
  std::int32_t vocab_size = 0;
  std::int32_t hidden_size = 0;         // GPT-2 n_embd
  std::int32_t num_layers = 0;          // GPT-2 n_layer
  std::int32_t num_heads = 0;           // GPT-2 n_head
  std::int32_t num_kv_heads = 0;        // GPT-2: = num_heads
  std::int32_t head_dim = 0;            // Qwen3: as given (may differ from hidden / heads)
  std::int32_t intermediate_size = 0;   // GPT-2 n_inner, or 4 * n_embd when null
  std::int32_t max_position_embeddings = 0;  // GPT-2 n_positions (n_ctx)
  float norm_eps = 1e-5f;               // layer_norm_epsilon / rms_norm_eps
  float rope_theta = 10000.0f;          // top level or rope_parameters.rope_theta
  bool tie_word_embeddings = true;
  std::string activation = "gelu_new";  // GPT-2 activation_function; Qwen3 hidden_act
  DType dtype = DType::f32;             // torch_dtype / dtype; f32 when absent
  std::optional<std::int32_t> bos_token_id;
  std::vector<std::int32_t> eos_token_ids;  // int or list in config.json

  // Throws Error(format) naming `source` and the field for a missing or mistyped required field
  // and for corrupt or absurd values (non-positive sizes, sizes past 2^30, heads not dividing,
  // ...): a config.json is a model file, and the C API promises FORMAT for a corrupt one.
  // Error(unsupported) for an unknown model_type or a feature xserv does not run. load() reads
  // at most kMaxSmallFileBytes (Error(format) past it) and only a regular file (Error(io)).
  static ModelConfig parse(std::string_view json, const std::string& source = "config.json");
  static ModelConfig load(const std::string& path);
};

}  // namespace xserv
