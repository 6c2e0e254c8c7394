#include "checks.hpp"

#include <filesystem>
#include <system_error>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "progress.hpp"

namespace xserv::cli {

namespace fs = std::filesystem;

void check_model_path(const std::string& path, ModelPath kind) {
  const char* what = kind == ModelPath::directory
                         ? "a Hugging Face model directory (config.json, *.safetensors, tokenizer files)"
                         : "a model directory or a tokenizer.json";
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    throw_error(ErrorCode::not_found, "cannot open '{}': no such file or directory (-m takes {})",
                path, what);
  if (fs::is_directory(st)) {
    const bool has_config = fs::exists(fs::path(path) / "config.json", ec);
    const bool has_tokenizer = fs::exists(fs::path(path) / "tokenizer.json", ec) ||
                               fs::exists(fs::path(path) / "vocab.json", ec);
    if (kind == ModelPath::directory && !has_config)
      throw_error(ErrorCode::not_found, "'{}' has no config.json: -m takes {}", path, what);
    if (kind == ModelPath::directory_or_tokenizer_file && !has_tokenizer)
      throw_error(ErrorCode::not_found, "'{}' has no tokenizer.json (nor vocab.json): -m takes {}",
                  path, what);
    return;
  }
  if (kind == ModelPath::directory) {
    const fs::path parent = fs::path(path).parent_path();
    throw_error(ErrorCode::invalid_argument, "'{}' is a file: -m takes {}; try -m {}", path, what,
                parent.empty() ? std::string(".") : parent.string());
  }
}

DeviceKind pick_device(const std::string& name) {
  if (name.empty() || name == "auto") return cuda_available() ? DeviceKind::cuda : DeviceKind::cpu;
  if (name == "cpu") return DeviceKind::cpu;
  if (name != "cuda")
    throw_error(ErrorCode::invalid_argument, "--device must be auto, cpu or cuda, not '{}'", name);
#ifndef XSERV_HAVE_CUDA
  throw_error(ErrorCode::unsupported,
              "--device cuda: this xserv-cli was built without the CUDA backend (configure with "
              "-DXSERV_CUDA=ON where nvcc is installed); use --device cpu");
#else
  if (!cuda_available())
    throw_error(ErrorCode::unsupported,
                "--device cuda: no usable NVIDIA GPU here (no device, or the driver is not loaded: "
                "`nvidia-smi` lists the usable GPUs); use --device cpu, or leave --device out to "
                "pick the device automatically");
  return DeviceKind::cuda;
#endif
}

void require_utf8(std::string_view text, std::string_view what) {
  const std::size_t bad = utf8::find_invalid(text);
  if (bad != std::string_view::npos)
    throw_error(ErrorCode::invalid_argument, "{} is not valid UTF-8 (bad byte at offset {})", what,
                bad);
}

std::optional<DType> parse_kv_cache_dtype(const std::string& text) {
  if (text == "auto") return std::nullopt;
  if (text == "f32") return DType::f32;
  if (text == "bf16") return DType::bf16;
  throw_error(ErrorCode::invalid_argument, "--kv-cache-dtype must be auto, f32 or bf16, not '{}'", text);
}

std::unique_ptr<ModelGroup> load_model_group(const std::string& dir, const std::string& device,
                                             int tp, std::size_t threads, ModelOptions options) {
  ParallelOptions p;
  p.device = pick_device(device);
  p.size = tp;
  p.threads = threads;
  options.on_progress = load_progress_bar(dir);  // draws on stderr only when it is a terminal
  return ModelGroup::load(dir, p, options);
}

}  // namespace xserv::cli
