#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <memory>

namespace xserv::cli {
namespace {

struct BarState {
  std::string label;
  int shown = -1;  // percentage on screen; -1: nothing drawn yet
};

void draw(const BarState& s, int percent, std::size_t done, std::size_t total) {
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
  bar[kWidth] = '\0';
  std::fprintf(stderr, "\r%s [%s] %3d%% %.1f/%.1f MB", s.label.c_str(), bar, percent,
               static_cast<double>(done) / 1e6, static_cast<double>(total) / 1e6);
  if (done >= total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace

std::function<void(std::size_t, std::size_t)> load_progress_bar(std::string label) {
  if (!isatty(STDERR_FILENO)) return {};
  auto state = std::make_shared<BarState>();
  state->label = "loading " + std::move(label);
  return [state](std::size_t done, std::size_t total) {
    if (total == 0) return;
    const int percent = static_cast<int>(done * 100 / total);
    if (percent == state->shown) return;
    state->shown = percent;
    draw(*state, percent, done, total);
  };
}

}  // namespace xserv::cli
