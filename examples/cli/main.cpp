// xserv-cli: the command-line front end over xserv's internals.
#include <cstdio>
#include <exception>
#include <string_view>

#include "commands.hpp"
#include "core/error.hpp"
#include "xserv/version.hpp"

namespace xserv::cli {
namespace {

int run_version(const Args&) {
  std::printf("xserv %s\n", XSERV_VERSION_STRING);
  return 0;
}

const Command kCommands[] = {
    {"version", "print the version", run_version},
    {"chat", "interactive multi-turn chat, streamed", run_chat},
    {"generate", "generate text from a prompt, streamed", run_generate},
#ifdef XSERV_CLI_BATCH
    {"batch", "JSONL requests on stdin -> JSONL results, one batch", run_batch},
#endif
    {"tokenize", "text on stdin -> token ids (JSON)", run_tokenize},
    {"detokenize", "token ids (JSON lines) -> text", run_detokenize},
};

void usage(std::FILE* out) {
  std::fprintf(out, "usage: xserv-cli <command> [options]    (xserv-cli --version: the version)\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "\n'xserv-cli <command> --help' describes a command's options.\n");
}

}  // namespace
}  // namespace xserv::cli

int main(int argc, char** argv) {
  using namespace xserv::cli;
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  if (name == "--version" || name == "-V") name = "version";
  Args args(argv + 2, argv + argc);
  for (const auto& c : kCommands) {
    if (name != c.name) continue;
    try {
      return c.run(args);
    } catch (const xserv::Error& e) {
      std::fprintf(stderr, "xserv-cli %s: %s\n", c.name, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "xserv-cli %s: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "xserv-cli: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
