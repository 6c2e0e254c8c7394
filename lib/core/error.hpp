// xserv::Error — the one exception type of xserv's internals.
//
// Internal code throws Error (a code plus a message that names the file, tensor or field at
// fault); the C facade catches it at the boundary and turns it into an xserv_status plus the
// thread-local message of xserv_last_error(). Nothing a user controls may assert() or abort().
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace xserv {

// Kept in step with xserv_status in capi/xserv.h (the facade maps one onto the other).
enum class ErrorCode {
  ok = 0,
  invalid_argument,
  not_found,
  io,
  format,
  unsupported,
  out_of_memory,
  resource_exhausted,
  cuda,
  cancelled,
  internal,
};

std::string_view to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// throw_error(ErrorCode::format, "{}: tensor '{}' has {} bytes, expected {}", path, name, a, b);
template <typename... Args>
[[noreturn]] void throw_error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

// Checks an invariant that user input can break; throws instead of asserting.
#define XSERV_CHECK(cond, code, ...)                  \
  do {                                                \
    if (!(cond)) ::xserv::throw_error(code, __VA_ARGS__); \
  } while (0)

}  // namespace xserv
