// The architectures xserv runs, keyed by config.json's model_type and architectures.
//
// Adding an architecture: write <name>.cpp with a factory that declares its weights on the
// WeightLoader, loads them, plans its workspace and returns the model; add a line to the table
// in model_registry.cpp (with the name component that holds its layers' indices).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/model.hpp"
#include "models/weight_loader.hpp"

namespace xserv {

using ModelFactory = std::unique_ptr<Model> (*)(const ModelConfig& config, const std::string& dir,
                                                Backend& backend, WeightLoader& weights,
                                                const ModelOptions& options);

struct ModelEntry {
  std::string_view model_type;    // config.json "model_type"
  std::string_view architecture;  // an entry of config.json "architectures"
  ModelFactory make;
  // The name component before a layer's index in tensor names ("h" in "transformer.h.3.ln_1",
  // "layers" in "model.layers.3.mlp"): Model::load counts the checkpoint's layers with it and
  // refuses a config that disagrees before anything is allocated from the config's sizes.
  std::string_view layer_container;
};

std::span<const ModelEntry> model_registry() noexcept;
// The entry for a config: by model_type first, then by any of the architectures; nullptr when
// xserv does not know it.
const ModelEntry* find_model(std::string_view model_type,
                             const std::vector<std::string>& architectures) noexcept;

std::unique_ptr<Model> make_gpt2(const ModelConfig&, const std::string&, Backend&, WeightLoader&,
                                 const ModelOptions&);
std::unique_ptr<Model> make_qwen3(const ModelConfig&, const std::string&, Backend&, WeightLoader&,
                                  const ModelOptions&);

}  // namespace xserv
