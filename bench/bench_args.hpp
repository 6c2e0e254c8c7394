// Helpers shared by the end-to-end benchmark programs: number parsing and the model directory
// made from a lone config.json (dummy weights).
#pragma once

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/error.hpp"
#include "models/model_group.hpp"

namespace xserv::bench {

template <typename T>
T number(const std::string& s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  XSERV_CHECK(ec == std::errc() && p == s.data() + s.size(), ErrorCode::invalid_argument,
              "'{}' is not a number", s);
  return v;
}

// "1,4,16" -> {1, 4, 16}.
inline std::vector<std::int32_t> number_list(const std::string& list) {
  std::vector<std::int32_t> out;
  for (std::size_t p = 0; p <= list.size();) {
    const std::size_t q = std::min(list.find(',', p), list.size());
    out.push_back(number<std::int32_t>(list.substr(p, q - p)));
    p = q + 1;
  }
  return out;
}

// The model directory to load: `model` itself, or (when empty) a temporary directory holding a
// copy of `config`, removed again by the destructor.
class ModelDir {
 public:
  ModelDir(const std::string& model, const std::string& config, const std::string& tag)
      : path_(model) {
    if (!path_.empty()) return;
    tmp_ = std::filesystem::temp_directory_path() /
           ("xserv-" + tag + "-" + std::to_string(std::hash<std::string>{}(config)));
    std::filesystem::create_directories(tmp_);
    std::filesystem::copy_file(config, tmp_ / "config.json",
                               std::filesystem::copy_options::overwrite_existing);
    path_ = tmp_.string();
  }
  ~ModelDir() {
    std::error_code ec;
    if (!tmp_.empty()) std::filesystem::remove_all(tmp_, ec);
  }
  ModelDir(const ModelDir&) = delete;
  ModelDir& operator=(const ModelDir&) = delete;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  std::filesystem::path tmp_;
};

// --device (empty: cuda when usable) and --tp of the benchmarks as ParallelOptions: ranks on
// GPUs 0 .. tp-1 (or CPU threads, `threads` each; 0: the default).
inline ParallelOptions parallel_options(const std::string& device, int tp, std::size_t threads) {
  ParallelOptions p;
  p.device = device.empty() ? (cuda_available() ? DeviceKind::cuda : DeviceKind::cpu)
             : device == "cuda" ? DeviceKind::cuda
                                : DeviceKind::cpu;
  p.size = tp;
  p.threads = threads;
  return p;
}

}  // namespace xserv::bench
