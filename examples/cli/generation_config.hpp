// The sampling defaults a model ships in generation_config.json (do_sample, temperature, top_k,
// top_p, min_p, repetition_penalty), applied as transformers does: only to the options the user
// did not give. Shared by `xserv-cli generate` (flags) and `xserv-cli batch` (JSON fields), so
// one request gives the same text through either.
#pragma once

#include <string>

#include "engine/sampling_params.hpp"

namespace xserv::cli {

// Which sampling options the user gave (generation_config.json must not override those).
struct GivenSampling {
  bool temperature = false, top_k = false, top_p = false, min_p = false,
       repetition_penalty = false;
};

// Sets the fields of `params` not in `given` from MODEL_DIR/generation_config.json when that
// file exists (do_sample = false means temperature 0). Throws Error(format) for broken JSON.
void apply_generation_config(const std::string& model_dir, const GivenSampling& given,
                             SamplingParams& params);

}  // namespace xserv::cli
