#include "models/model_registry.hpp"

namespace xserv {

namespace {
constexpr ModelEntry kModels[] = {
    {"gpt2", "GPT2LMHeadModel", make_gpt2, "h"},
    {"qwen3", "Qwen3ForCausalLM", make_qwen3, "layers"},
};
}  // namespace

std::span<const ModelEntry> model_registry() noexcept { return kModels; }

const ModelEntry* find_model(std::string_view model_type,
                             const std::vector<std::string>& architectures) noexcept {
  for (const auto& e : kModels)
    if (e.model_type == model_type) return &e;
  for (const auto& a : architectures)
    for (const auto& e : kModels)
      if (e.architecture == a) return &e;
  return nullptr;
}

}  // namespace xserv
