#include "generation_config.hpp"

#include <simdjson.h>

#include <filesystem>

#include "core/mapped_file.hpp"
#include "io/json.hpp"

namespace xserv::cli {

void apply_generation_config(const std::string& model_dir, const GivenSampling& given,
                             SamplingParams& params) {
  const std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return;
  simdjson::dom::parser parser;
  const std::string text = read_file(path);
  simdjson::dom::object obj;
  if (json::parse(parser, text, path).get_object().get(obj) != simdjson::SUCCESS) return;
  const bool sample = json::get_bool(obj, "do_sample", path).value_or(true);
  if (!given.temperature) {
    if (!sample) params.temperature = 0.0f;
    else if (auto t = json::get_number(obj, "temperature", path)) params.temperature = static_cast<float>(*t);
  }
  if (!given.top_k)
    if (auto k = json::get_int(obj, "top_k", path)) params.top_k = static_cast<std::int32_t>(*k);
  if (!given.top_p)
    if (auto p = json::get_number(obj, "top_p", path)) params.top_p = static_cast<float>(*p);
  if (!given.min_p)
    if (auto p = json::get_number(obj, "min_p", path)) params.min_p = static_cast<float>(*p);
  if (!given.repetition_penalty)
    if (auto r = json::get_number(obj, "repetition_penalty", path))
      params.repetition_penalty = static_cast<float>(*r);
}

}  // namespace xserv::cli
