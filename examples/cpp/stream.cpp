// Streaming generation with the C++ API: tokens are printed as they come, then a summary.
//
//   stream MODEL_DIR [PROMPT] [-n N] [--temperature T] [--seed S] [--chat]
//
// With --chat the prompt is sent as a user message through the model's chat template (Qwen3);
// a model without one (GPT-2) gets the prompt as plain text, as xserv-cli does. A loading
// percentage is drawn on stderr only when it is a terminal. Bad numbers are rejected.
#include <unistd.h>

#include <xserv/xserv.hpp>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace {

// The whole of `text` as a number of type T, or std::invalid_argument naming the option.
template <typename T>
T parse_number(const std::string& option, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc() || stop != end)
    throw std::invalid_argument(option + ": '" + text + "' is not a valid number");
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL_DIR [PROMPT] [-n N] [--temperature T] [--seed S] [--chat]\n",
                 argv[0]);
    return 2;
  }
  std::string prompt = "ROMEO:";
  xserv::GenerateOptions options;
  options.max_tokens = 128;
  options.temperature = 0.8f;
  options.top_k = 40;
  bool chat = false;
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool takes_value = arg == "-n" || arg == "--temperature" || arg == "--seed";
      if (takes_value && i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      if (arg == "-n") {
        options.max_tokens = parse_number<int>(arg, argv[++i]);
      } else if (arg == "--temperature") {
        options.temperature = parse_number<float>(arg, argv[++i]);
      } else if (arg == "--seed") {
        options.seed = parse_number<std::uint64_t>(arg, argv[++i]);
      } else if (arg == "--chat") {
        chat = true;
      } else if (arg.size() > 1 && arg[0] == '-') {
        throw std::invalid_argument("unknown option '" + arg + "'");
      } else {
        prompt = arg;
      }
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }

  try {
    xserv::ModelOptions model_options;
    const bool terminal = isatty(STDERR_FILENO) != 0;
    int shown = -1;
    if (terminal) {  // "\r" redraws in place on a terminal; in a log it would pile up on one line
      model_options.on_progress = [&shown](float f) {
        const int percent = static_cast<int>(f * 100.0f);
        if (percent != shown) std::fprintf(stderr, "\rloading %3d%%", shown = percent);
        return true;
      };
    }
    xserv::Model model = xserv::Model::load(argv[1], model_options);
    std::fprintf(stderr, "%s%s\n", terminal ? "\r" : "", model.desc().c_str());

    std::string input = prompt;
    if (chat && !model.has_chat_template()) {
      std::fprintf(stderr, "the model has no chat template: the prompt is sent as plain text\n");
      chat = false;
    }
    if (chat) {
      input = model.apply_chat_template({{"user", prompt}}, /*add_generation_prompt=*/true,
                                        /*enable_thinking=*/false);
    } else {
      std::cout << prompt;
    }
    int tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    model.generate(input, options, [&](const xserv::TokenEvent& event) {
      std::cout << event.text << std::flush;
      ++tokens;
      return true;
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << '\n';
    std::fprintf(stderr, "%d tokens in %.2f s (%.1f tokens/s)\n", tokens, seconds,
                 seconds > 0 ? tokens / seconds : 0.0);
  } catch (const xserv::Error& e) {
    std::fprintf(stderr, "error (%s): %s\n", e.status_name(), e.what());
    return 1;
  }
  return 0;
}
