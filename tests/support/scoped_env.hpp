// An environment variable set for one scope, restored (or removed) when the scope ends, also
// when a REQUIRE throws: for tests of the switches xserv reads from the environment
// (XSERV_CPU_CONV1D, XSERV_NCCL_LIBRARY, XSERV_CUDA_PREFILL_MMA, ...).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace xserv::test {

class ScopedEnv {
 public:
  // value nullptr: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace xserv::test
