// The check helpers of the C++17 API tests (cpp_api_test.cpp, engine_cpp_test.cpp): programs
// linked against libxserv alone, so no test framework. CHECK counts and reports; main() returns
// failure when any failed (report_checks).
#pragma once

#include <xserv/xserv.hpp>

#include <cstdio>
#include <string>

namespace {

int g_checks = 0;
int g_failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    ++g_checks;                                                                      \
    if (!(cond)) {                                                                   \
      ++g_failures;                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
    }                                                                                \
  } while (0)

// The status of the xserv::Error that f() throws, XSERV_OK when it throws none.
template <typename F>
xserv_status status_of(F&& f) {
  try {
    f();
  } catch (const xserv::Error& e) {
    return e.status();
  }
  return XSERV_OK;
}

// Prints the totals and gives main()'s exit status.
inline int report_checks(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

const std::string kModel = XSERV_SOURCE_DIR "/examples/models/shakespeare";

}  // namespace
