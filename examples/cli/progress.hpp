// Progress bars on stderr. A load bar, for any command that loads a model:
//
//   ModelOptions options;
//   options.on_progress = cli::load_progress_bar(dir);
//
// It draws only when stderr is a terminal (pipelines and tests see nothing) and redraws only
// when the shown percentage changes, so per-tensor callbacks cost next to nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace xserv::cli {

// An on_progress callback (bytes done, bytes total) that draws "label [=====>    ]  42% 12/27 MB"
// and ends the line when done == total.
std::function<void(std::size_t, std::size_t)> load_progress_bar(std::string label);

// The same bar over a count of items (e.g. requests done): "label [=====>    ]  42% 3/7".
// Empty (nothing to call) when stderr is not a terminal.
std::function<void(std::size_t, std::size_t)> count_progress_bar(std::string label);

}  // namespace xserv::cli
