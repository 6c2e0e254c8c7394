// xserv-cli subcommands. Each takes the arguments after its name and returns the exit code;
// errors are reported on stderr by main() (every command may throw xserv::Error).
#pragma once

#include <string>
#include <vector>

namespace xserv::cli {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

// The command table lives in main.cpp; commands are implemented in cmd_<name>.cpp.

int run_tokenize(const Args& args);    // cmd_tokenize.cpp
int run_detokenize(const Args& args);  // cmd_tokenize.cpp

int run_generate(const Args& args);    // cmd_generate.cpp

int run_chat(const Args& args);        // cmd_chat.cpp

int run_batch(const Args& args);       // cmd_batch.cpp (built when nlohmann-json is found)

}  // namespace xserv::cli
