#include <catch2/catch.hpp>

#include "core/error.hpp"
#include "io/model_config.hpp"

using namespace xserv;

namespace {

// GPT-2 124M's config.json as released (abridged to the fields xserv reads plus noise).
const char* kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
  "bos_token_id": 50256, "eos_token_id": 50256, "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_inner": null,
  "n_layer": 12, "n_positions": 1024, "vocab_size": 50257,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}
})";

// Qwen3-0.6B's config.json as released: head_dim 128 although 1024 / 16 = 64.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
})";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  return s.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("config: GPT-2 124M", "[io][config]") {
  auto c = ModelConfig::parse(kGpt2);
  CHECK(c.arch == ModelArch::gpt2);
  CHECK(c.hidden_size == 768);
  CHECK(c.num_layers == 12);
  CHECK(c.num_heads == 12);
  CHECK(c.num_kv_heads == 12);
  CHECK(c.head_dim == 64);
  CHECK(c.intermediate_size == 3072);  // n_inner null -> 4 * n_embd
  CHECK(c.max_position_embeddings == 1024);
  CHECK(c.norm_eps == Approx(1e-5));
  CHECK(c.tie_word_embeddings);
  CHECK(c.dtype == DType::f32);
  CHECK(c.eos_token_ids == std::vector<std::int32_t>{50256});
  CHECK(c.bos_token_id == 50256);
}

TEST_CASE("config: GPT-2 variants (n_ctx only, explicit n_inner)", "[io][config]") {
  auto no_pos = replace(kGpt2, R"("n_positions": 1024,)", "");
  CHECK(ModelConfig::parse(no_pos).max_position_embeddings == 1024);
  auto neither = replace(no_pos, R"("n_ctx": 1024,)", "");
  CHECK_THROWS_WITH(ModelConfig::parse(neither), Catch::Contains("n_positions"));
  CHECK(ModelConfig::parse(replace(kGpt2, R"("n_inner": null)", R"("n_inner": 1000)")).intermediate_size == 1000);
  CHECK_THROWS_WITH(ModelConfig::parse(replace(kGpt2, "gelu_new", "relu")), Catch::Contains("relu"));
  // The default n_inner of a huge n_embd: an error, not a signed overflow (fuzz_config found it).
  CHECK_THROWS_WITH(ModelConfig::parse(replace(kGpt2, R"("n_embd": 768)", R"("n_embd": 600000000)")),
                    Catch::Contains("n_inner"));
}

TEST_CASE("config: Qwen3-0.6B keeps head_dim as given", "[io][config]") {
  auto c = ModelConfig::parse(kQwen3);
  CHECK(c.arch == ModelArch::qwen3);
  CHECK(c.head_dim == 128);
  CHECK(c.num_heads == 16);
  CHECK(c.num_kv_heads == 8);
  CHECK(c.rope_theta == 1e6f);
  CHECK(c.norm_eps == Approx(1e-6));
  CHECK(c.tie_word_embeddings);
  CHECK(c.dtype == DType::bf16);
  CHECK(c.max_position_embeddings == 40960);
  CHECK(c.eos_token_ids == std::vector<std::int32_t>{151645});
}

TEST_CASE("config: Qwen3 as transformers 5 writes it (rope_parameters, dtype, eos list)", "[io][config]") {
  std::string s = replace(kQwen3, R"("rope_theta": 1000000,)",
                          R"("rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default"},)");
  s = replace(s, R"("torch_dtype": "bfloat16")", R"("dtype": "float32")");
  s = replace(s, R"("eos_token_id": 151645)", R"("eos_token_id": [151645, 151643])");
  s = replace(s, R"("head_dim": 128, )", "");
  auto c = ModelConfig::parse(s);
  CHECK(c.rope_theta == 5e6f);
  CHECK(c.dtype == DType::f32);
  CHECK(c.eos_token_ids == std::vector<std::int32_t>{151645, 151643});
  CHECK(c.head_dim == 64);  // absent: hidden / heads
}

TEST_CASE("config: malformed or unsupported configs are clear errors", "[io][config]") {
  auto fails = [](const std::string& json, ErrorCode code, const std::string& needle) {
    try {
      ModelConfig::parse(json, "cfg.json");
      FAIL("parsed: " << needle);
    } catch (const Error& e) {
      CHECK(e.code() == code);
      CHECK_THAT(e.what(), Catch::Contains(needle) && Catch::Contains("cfg.json"));
    }
  };
  fails("{", ErrorCode::format, "invalid JSON");
  fails("[]", ErrorCode::format, "not a JSON object");
  fails(R"({"model_type": "llama"})", ErrorCode::unsupported, "llama");
  fails(replace(kQwen3, R"("hidden_size": 1024,)", ""), ErrorCode::format, "'hidden_size'");
  fails(replace(kQwen3, R"("hidden_size": 1024)", R"("hidden_size": "big")"), ErrorCode::format, "'hidden_size'");
  fails(replace(kQwen3, R"("num_key_value_heads": 8)", R"("num_key_value_heads": 3)"), ErrorCode::format, "multiple");
  fails(replace(kQwen3, R"("num_hidden_layers": 28)", R"("num_hidden_layers": 0)"), ErrorCode::format, "layer count");
  fails(replace(kQwen3, R"("vocab_size": 151936)", R"("vocab_size": -5)"), ErrorCode::format, "vocab_size");
  fails(replace(kQwen3, R"("torch_dtype": "bfloat16")", R"("torch_dtype": "int8")"), ErrorCode::unsupported, "int8");
  fails(replace(kQwen3, R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "yarn", "factor": 4})"), ErrorCode::unsupported, "yarn");
  fails(replace(kGpt2, R"("eos_token_id": 50256)", R"("eos_token_id": 60000)"), ErrorCode::format, "eos_token_id");
  fails(replace(kGpt2, R"("n_head": 12)", R"("n_head": 7)"), ErrorCode::format, "divisible");
  // Zero, negative, absurd and non-integer sizes: FORMAT, as xserv.h promises for corrupt files.
  fails(replace(kGpt2, R"("n_layer": 12)", R"("n_layer": 4000000000)"), ErrorCode::format, "n_layer");
  fails(replace(kGpt2, R"("n_embd": 768)", R"("n_embd": 1e300)"), ErrorCode::format, "n_embd");
  fails(replace(kGpt2, R"("n_embd": 768)", R"("n_embd": 0)"), ErrorCode::format, "hidden size");
  fails(replace(kGpt2, R"("n_head": 12)", R"("n_head": 2.5)"), ErrorCode::format, "n_head");
  fails(replace(kGpt2, R"("n_positions": 1024)", R"("n_positions": -1)"), ErrorCode::format, "n_positions");
  fails(replace(kGpt2, R"("vocab_size": 50257)", R"("vocab_size": 18446744073709551615)"), ErrorCode::format, "vocab_size");
  fails(replace(kQwen3, R"("rms_norm_eps": 1e-06)", R"("rms_norm_eps": -1)"), ErrorCode::format, "epsilon");
  fails(replace(kQwen3, R"("rope_theta": 1000000)", R"("rope_theta": 0)"), ErrorCode::format, "rope_theta");
  // Found by tests/fuzz/fuzz_config: doubles past int64 / float were converted before checking.
  fails(replace(kGpt2, R"("n_positions": 1024)", R"("n_positions": 1E28)"), ErrorCode::format, "n_positions");
  fails(replace(kQwen3, R"("rms_norm_eps": 1e-06)", R"("rms_norm_eps": 1e300)"), ErrorCode::format, "rms_norm_eps");
  fails(replace(kQwen3, R"("rope_theta": 1000000)", R"("rope_theta": -1e39)"), ErrorCode::format, "rope_theta");
}

TEST_CASE("config: model_type may come from architectures", "[io][config]") {
  auto c = ModelConfig::parse(replace(kQwen3, R"("model_type": "qwen3",)", ""));
  CHECK(c.arch == ModelArch::qwen3);
}
