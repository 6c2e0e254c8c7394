// Streaming generation with the C++ API: tokens are printed as they come, then a summary.
//
//   stream MODEL_DIR [PROMPT] [-n N] [--temperature T] [--seed S] [--chat]
//
// With --chat (a model with a chat template, e.g. Qwen3) the prompt is sent as a user message.
#include <xserv/xserv.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

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
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "-n" && has_value) {
      options.max_tokens = std::atoi(argv[++i]);
    } else if (arg == "--temperature" && has_value) {
      options.temperature = std::strtof(argv[++i], nullptr);
    } else if (arg == "--seed" && has_value) {
      options.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--chat") {
      chat = true;
    } else {
      prompt = arg;
    }
  }

  try {
    xserv::ModelOptions model_options;
    int shown = -1;
    model_options.on_progress = [&shown](float f) {
      const int percent = static_cast<int>(f * 100.0f);
      if (percent != shown) std::fprintf(stderr, "\rloading %3d%%", shown = percent);
      return true;
    };
    xserv::Model model = xserv::Model::load(argv[1], model_options);
    std::fprintf(stderr, "\r%s\n", model.desc().c_str());

    std::string input = prompt;
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
