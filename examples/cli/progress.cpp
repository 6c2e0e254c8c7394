#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <memory>

namespace xserv::cli {
namespace {

struct BarState {
  std::string label;
  bool bytes = true;  // counts bytes (shown in MB), else items
  int shown = -1;  // percentage on screen; -1: nothing drawn yet
};

void draw(const BarState& s, int percent, std::size_t done, std::size_t total) {
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
  bar[kWidth] = '\0';
  if (s.bytes)
    std::fprintf(stderr, "\r%s [%s] %3d%% %.1f/%.1f MB", s.label.c_str(), bar, percent,
                 static_cast<double>(done) / 1e6, static_cast<double>(total) / 1e6);
  else
    std::fprintf(stderr, "\r%s [%s] %3d%% %zu/%zu", s.label.c_str(), bar, percent, done, total);
  if (done >= total) std::fputc('\n', stderr);
  std::fflush(stderr);
}


std::function<void(std::size_t, std::size_t)> progress_bar(std::string label, bool bytes) {
  if (!isatty(STDERR_FILENO)) return {};
  auto state = std::make_shared<BarState>();
  state->label = std::move(label);
  state->bytes = bytes;
  return [state](std::size_t done, std::size_t total) {
    if (total == 0) return;
    const int percent = static_cast<int>(done * 100 / total);
    if (percent == state->shown) return;
    state->shown = percent;
    draw(*state, percent, done, total);
  };
}

}  // namespace

std::function<void(std::size_t, std::size_t)> load_progress_bar(std::string label) {
  return progress_bar("loading " + std::move(label), true);
}

std::function<void(std::size_t, std::size_t)> count_progress_bar(std::string label) {
  return progress_bar(std::move(label), false);
}

}  // namespace xserv::cli
