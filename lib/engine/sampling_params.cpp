#include "engine/sampling_params.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.hpp"
#include "core/mapped_file.hpp"
#include "io/json.hpp"

namespace xserv {

void SamplingParams::validate() const {
  auto check_range = [](float v, float lo, float hi, const char* name) {
    XSERV_CHECK(std::isfinite(v) && v >= lo && v <= hi, ErrorCode::invalid_argument,
                "sampling: {} = {} (expected {} ..= {})", name, v, lo, hi);
  };
  check_range(temperature, 0.0f, 100.0f, "temperature");
  XSERV_CHECK(top_k >= 0, ErrorCode::invalid_argument, "sampling: top_k = {} (expected >= 0)",
              top_k);
  XSERV_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, ErrorCode::invalid_argument,
              "sampling: top_p = {} (expected 0 < top_p <= 1)", top_p);
  check_range(min_p, 0.0f, 1.0f, "min_p");
  XSERV_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f &&
                  repetition_penalty <= 100.0f,
              ErrorCode::invalid_argument,
              "sampling: repetition_penalty = {} (expected 0 < r <= 100)", repetition_penalty);
  check_range(presence_penalty, -2.0f, 2.0f, "presence_penalty");
  check_range(frequency_penalty, -2.0f, 2.0f, "frequency_penalty");
  XSERV_CHECK(max_tokens >= 0, ErrorCode::invalid_argument,
              "sampling: max_tokens = {} (expected >= 0)", max_tokens);
  for (auto id : stop_token_ids)
    XSERV_CHECK(id >= 0, ErrorCode::invalid_argument, "sampling: stop token id {}", id);
  for (const auto& s : stop_strings)
    XSERV_CHECK(!s.empty(), ErrorCode::invalid_argument, "sampling: empty stop string");
}

SamplingRow SamplingParams::row(std::uint64_t seed_value, std::uint64_t step) const noexcept {
  SamplingRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  r.repetition_penalty = repetition_penalty;
  r.presence_penalty = presence_penalty;
  r.frequency_penalty = frequency_penalty;
  r.seed = seed_value;
  r.step = step;
  return r;
}

std::vector<std::int32_t> load_eos_token_ids(const std::string& model_dir,
                                             const ModelConfig& config) {
  std::vector<std::int32_t> ids = config.eos_token_ids;
  const std::string path = model_dir + "/generation_config.json";
  if (std::filesystem::exists(path)) {
    simdjson::dom::parser parser;
    const std::string text = read_file(path);
    auto root = json::parse(parser, text, path);
    simdjson::dom::object obj;
    XSERV_CHECK(root.get_object().get(obj) == simdjson::SUCCESS, ErrorCode::format,
                "{}: expected a JSON object", path);
    simdjson::dom::element e;
    if (obj.at_key("eos_token_id").get(e) == simdjson::SUCCESS && !e.is_null()) {
      auto add = [&](simdjson::dom::element v) {
        std::int64_t id = 0;
        XSERV_CHECK(v.get_int64().get(id) == simdjson::SUCCESS && id >= 0 && id < (1ll << 31),
                    ErrorCode::format, "{}: eos_token_id must be a token id or a list of them",
                    path);
        ids.push_back(static_cast<std::int32_t>(id));
      };
      simdjson::dom::array arr;
      if (e.get_array().get(arr) == simdjson::SUCCESS) {
        for (auto v : arr) add(v);
      } else {
        add(e);
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace xserv
