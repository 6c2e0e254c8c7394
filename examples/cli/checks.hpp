// Checks shared by the xserv-cli commands on what the user typed: the -m path, --device and
// text options. Each throws xserv::Error(invalid_argument or not_found) with a message that
// says what is wrong and what to do, before anything is loaded, so the user never sees a
// lower layer's message about a file they did not name (or a raw CUDA driver error).
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <string_view>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "models/model_group.hpp"

namespace xserv::cli {

// What -m accepts: generate and chat need a model directory; tokenize/detokenize also take a
// tokenizer.json.
enum class ModelPath { directory, directory_or_tokenizer_file };

// Fails for a path that does not exist, a file where a directory is needed (e.g.
// `-m DIR/config.json`) and a directory without config.json (or tokenizer files).
void check_model_path(const std::string& path, ModelPath kind);

// --device: "" or "auto" = CUDA when a GPU is usable, else the CPU; "cpu"; "cuda" (fails
// clearly when this build has no CUDA backend or no GPU is usable).
DeviceKind pick_device(const std::string& name);

// The model of `dir` on --device, split over --tp ranks (GPUs 0 .. tp-1; CPU: threads, each
// with `threads` workers, 0 = the default), the load progress drawn on stderr when it is a
// terminal. The commands' one way to load: tp 1 is the model on one backend.
std::unique_ptr<ModelGroup> load_model_group(const std::string& dir, const std::string& device,
                                             int tp, std::size_t threads,
                                             ModelOptions options = {});

// --kv-cache-dtype: "auto" (the backend's choice) is nullopt, else "f32" or "bf16"
// (ModelOptions::kv_dtype); Error(invalid_argument) naming the flag otherwise.
std::optional<DType> parse_kv_cache_dtype(const std::string& text);

// Fails when `text` is not valid UTF-8, naming `what` (e.g. "--stop") and the byte offset.
void require_utf8(std::string_view text, std::string_view what);

// The number `text` (all of it) for option `flag`; Error(invalid_argument) otherwise.
template <typename T>
T parse_number(const std::string& flag, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  XSERV_CHECK(ec == std::errc() && p == end, ErrorCode::invalid_argument,
              "{}: '{}' is not a valid number", flag, text);
  return v;
}

}  // namespace xserv::cli
