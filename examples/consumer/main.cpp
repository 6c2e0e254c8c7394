// An application built against an installed xserv (find_package(xserv), target xserv::xserv).
//
//   consumer --version
//   consumer MODEL_DIR [PROMPT]
#include <xserv/xserv.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s --version | MODEL_DIR [PROMPT]\n", argv[0]);
    return 2;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::cout << "xserv " << xserv::version() << " (ABI " << XSERV_ABI_VERSION << ")\n";
    return 0;
  }
  try {
    xserv::ModelOptions model_options;
    model_options.device = xserv::Device::cpu;
    xserv::Model model = xserv::Model::load(argv[1], model_options);
    const std::string prompt = argc > 2 ? argv[2] : "ROMEO:";

    xserv::GenerateOptions options;
    options.max_tokens = 32;
    options.temperature = 0;  // greedy: the same text every run
    std::cout << prompt;
    const std::string text =
        model.generate(prompt, options, [](const xserv::TokenEvent& event) {
          std::cout << event.text << std::flush;
          return true;
        });
    std::cout << '\n';
    return text.empty() ? 1 : 0;
  } catch (const xserv::Error& e) {
    std::fprintf(stderr, "xserv error (%s): %s\n", e.status_name(), e.what());
    return 1;
  }
}
