#include "io/model_config.hpp"

#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "io/json.hpp"

namespace xserv {

std::string_view arch_name(ModelArch a) noexcept {
  return a == ModelArch::qwen3 ? "qwen3" : "gpt2";
}

namespace {

struct Reader {
  simdjson::dom::object obj;
  const std::string& source;

  std::int32_t required_int(std::string_view key) const {
    auto v = json::get_int(obj, key, source);
    XSERV_CHECK(v.has_value(), ErrorCode::format, "{}: required field '{}' is missing", source, key);
    return checked_int(key, *v);
  }
  std::optional<std::int32_t> optional_int(std::string_view key) const {
    auto v = json::get_int(obj, key, source);
    if (!v) return std::nullopt;
    return checked_int(key, *v);
  }
  std::int32_t checked_int(std::string_view key, std::int64_t v) const {
    XSERV_CHECK(v >= 0 && v <= (1 << 30), ErrorCode::format,
                "{}: field '{}' = {} is out of range", source, key, v);
    return static_cast<std::int32_t>(v);
  }
  // Token ids may be an int or a list of ints (generation_config style).
  std::vector<std::int32_t> id_list(std::string_view key) const {
    std::vector<std::int32_t> ids;
    simdjson::dom::element e;
    if (obj.at_key(key).get(e) != simdjson::SUCCESS || e.is_null()) return ids;
    simdjson::dom::array arr;
    if (e.get_array().get(arr) == simdjson::SUCCESS) {
      for (auto item : arr) {
        std::int64_t v = 0;
        XSERV_CHECK(item.get_int64().get(v) == simdjson::SUCCESS, ErrorCode::format,
                    "{}: field '{}' must hold integers", source, key);
        ids.push_back(checked_int(key, v));
      }
      return ids;
    }
    ids.push_back(required_int(key));
    return ids;
  }
};

// A float field: a double outside float's range (1e300) would make the conversion undefined,
// so it is refused here; validate() then checks the value's meaning.
float checked_float(std::optional<double> v, double fallback, std::string_view key,
                    const std::string& source) {
  const double d = v.value_or(fallback);
  XSERV_CHECK(std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max(),
              ErrorCode::format, "{}: field '{}' = {} is out of range", source, key, d);
  return static_cast<float>(d);
}

void parse_gpt2(const Reader& r, ModelConfig& c) {
  c.arch = ModelArch::gpt2;
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("n_embd");
  c.num_layers = r.required_int("n_layer");
  c.num_heads = r.required_int("n_head");
  c.num_kv_heads = c.num_heads;
  // n_positions is the learned-position table size; older configs also (or only) have n_ctx.
  auto n_pos = r.optional_int("n_positions");
  if (!n_pos) n_pos = r.optional_int("n_ctx");
  XSERV_CHECK(n_pos.has_value(), ErrorCode::format, "{}: required field 'n_positions' (or 'n_ctx') is missing", r.source);
  c.max_position_embeddings = *n_pos;
  // n_inner null or absent: 4 x n_embd, computed wide (n_embd may be up to 2^30 here) and held
  // to the fields' range rather than overflowed (found by fuzz_config).
  const auto n_inner = r.optional_int("n_inner");
  c.intermediate_size =
      n_inner ? *n_inner : r.checked_int("n_inner (4 x n_embd)", 4 * std::int64_t{c.hidden_size});
  c.norm_eps = checked_float(json::get_number(r.obj, "layer_norm_epsilon", r.source), 1e-5,
                             "layer_norm_epsilon", r.source);
  c.activation = json::get_string(r.obj, "activation_function", r.source).value_or("gelu_new");
  XSERV_CHECK(c.activation == "gelu_new" || c.activation == "gelu_pytorch_tanh" ||
                  c.activation == "gelu_fast",
              ErrorCode::unsupported, "{}: activation_function '{}' is not supported (gelu_new is)",
              r.source, c.activation);
  c.tie_word_embeddings = json::get_bool(r.obj, "tie_word_embeddings", r.source).value_or(true);
  if (c.num_heads > 0) c.head_dim = c.hidden_size / c.num_heads;
}

void parse_qwen3(const Reader& r, ModelConfig& c) {
  c.arch = ModelArch::qwen3;
  c.vocab_size = r.required_int("vocab_size");
  c.hidden_size = r.required_int("hidden_size");
  c.num_layers = r.required_int("num_hidden_layers");
  c.num_heads = r.required_int("num_attention_heads");
  c.num_kv_heads = r.optional_int("num_key_value_heads").value_or(c.num_heads);
  c.intermediate_size = r.required_int("intermediate_size");
  c.max_position_embeddings = r.required_int("max_position_embeddings");
  // head_dim as given: Qwen3-0.6B has hidden 1024 over 16 heads but head_dim 128.
  auto hd = r.optional_int("head_dim");
  c.head_dim = hd ? *hd : (c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.norm_eps = checked_float(json::get_number(r.obj, "rms_norm_eps", r.source), 1e-6,
                             "rms_norm_eps", r.source);
  // Released checkpoints write rope_theta at the top level; transformers 5 writes it inside
  // rope_parameters. Accept both.
  std::optional<double> theta = json::get_number(r.obj, "rope_theta", r.source);
  simdjson::dom::object rope;
  if (r.obj["rope_parameters"].get_object().get(rope) == simdjson::SUCCESS) {
    std::string src = r.source + " rope_parameters";
    if (auto t = json::get_number(rope, "rope_theta", src)) theta = t;
    if (auto type = json::get_string(rope, "rope_type", src))
      XSERV_CHECK(*type == "default", ErrorCode::unsupported, "{}: rope_type '{}' is not supported",
                  r.source, *type);
  }
  simdjson::dom::object scaling;
  if (r.obj["rope_scaling"].get_object().get(scaling) == simdjson::SUCCESS) {
    auto type = json::get_string(scaling, "rope_type", r.source);
    if (!type) type = json::get_string(scaling, "type", r.source);
    XSERV_CHECK(!type || *type == "default", ErrorCode::unsupported,
                "{}: rope_scaling '{}' is not supported", r.source, type.value_or("?"));
  }
  c.rope_theta = checked_float(theta, 10000.0, "rope_theta", r.source);
  c.activation = json::get_string(r.obj, "hidden_act", r.source).value_or("silu");
  XSERV_CHECK(c.activation == "silu", ErrorCode::unsupported, "{}: hidden_act '{}' is not supported",
              r.source, c.activation);
  c.tie_word_embeddings = json::get_bool(r.obj, "tie_word_embeddings", r.source).value_or(false);
  XSERV_CHECK(!json::get_bool(r.obj, "attention_bias", r.source).value_or(false), ErrorCode::unsupported,
              "{}: attention_bias = true is not supported", r.source);
}

void validate(const ModelConfig& c, const std::string& source) {
  auto positive = [&](std::int32_t v, const char* what) {
    XSERV_CHECK(v > 0, ErrorCode::format, "{}: {} must be positive (got {})", source, what, v);
  };
  positive(c.vocab_size, "vocab size");
  positive(c.hidden_size, "hidden size");
  positive(c.num_layers, "layer count");
  positive(c.num_heads, "head count");
  positive(c.num_kv_heads, "key/value head count");
  positive(c.head_dim, "head dim");
  positive(c.intermediate_size, "intermediate size");
  positive(c.max_position_embeddings, "max position embeddings");
  XSERV_CHECK(c.num_heads % c.num_kv_heads == 0, ErrorCode::format,
              "{}: {} attention heads are not a multiple of {} key/value heads", source, c.num_heads,
              c.num_kv_heads);
  if (c.arch == ModelArch::gpt2)
    XSERV_CHECK(c.hidden_size % c.num_heads == 0, ErrorCode::format,
                "{}: n_embd {} is not divisible by n_head {}", source, c.hidden_size, c.num_heads);
  XSERV_CHECK(c.head_dim % 2 == 0 && c.head_dim <= 512, ErrorCode::unsupported,
              "{}: head_dim {} is not supported (even, at most 512)", source, c.head_dim);
  XSERV_CHECK(c.norm_eps > 0 && c.norm_eps < 1, ErrorCode::format,
              "{}: norm epsilon {} is absurd", source, c.norm_eps);
  XSERV_CHECK(c.rope_theta > 0, ErrorCode::format, "{}: rope_theta {} must be positive",
              source, c.rope_theta);
  for (auto id : c.eos_token_ids)
    XSERV_CHECK(id < c.vocab_size, ErrorCode::format, "{}: eos_token_id {} >= vocab size {}",
                source, id, c.vocab_size);
}

}  // namespace

ModelConfig ModelConfig::parse(std::string_view text, const std::string& source) {
  simdjson::dom::parser parser;
  auto root = json::parse(parser, text, source);
  simdjson::dom::object obj;
  XSERV_CHECK(root.get_object().get(obj) == simdjson::SUCCESS, ErrorCode::format,
              "{}: not a JSON object", source);
  Reader r{obj, source};

  ModelConfig c;
  auto model_type = json::get_string(obj, "model_type", source);
  if (!model_type) {
    // Fall back on architectures[0] ("GPT2LMHeadModel", "Qwen3ForCausalLM").
    simdjson::dom::array archs;
    std::string_view first;
    if (obj["architectures"].get_array().get(archs) == simdjson::SUCCESS && archs.size() > 0 &&
        archs.at(0).get_string().get(first) == simdjson::SUCCESS) {
      if (first.starts_with("GPT2")) model_type = "gpt2";
      if (first.starts_with("Qwen3")) model_type = "qwen3";
    }
  }
  XSERV_CHECK(model_type.has_value(), ErrorCode::format, "{}: required field 'model_type' is missing", source);
  c.model_type = *model_type;
  if (c.model_type == "gpt2") {
    parse_gpt2(r, c);
  } else if (c.model_type == "qwen3") {
    parse_qwen3(r, c);
  } else {
    throw_error(ErrorCode::unsupported, "{}: model_type '{}' is not supported (gpt2, qwen3 are)",
                source, c.model_type);
  }

  auto dtype_name_str = json::get_string(obj, "torch_dtype", source);
  if (!dtype_name_str) dtype_name_str = json::get_string(obj, "dtype", source);
  if (dtype_name_str) {
    auto dt = dtype_from_torch(*dtype_name_str);
    XSERV_CHECK(dt.has_value(), ErrorCode::unsupported, "{}: dtype '{}' is not supported", source,
                *dtype_name_str);
    c.dtype = *dt;
  }
  auto bos = r.id_list("bos_token_id");
  if (!bos.empty()) c.bos_token_id = bos.front();
  c.eos_token_ids = r.id_list("eos_token_id");
  validate(c, source);
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) { return parse(read_file(path), path); }

}  // namespace xserv
