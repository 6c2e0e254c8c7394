// xserv.h and the C++ wrapper compiled as C++17 with -Wall -Wextra -pedantic -Werror: users on an
// older standard than the library's C++20 must be able to include both.
#include <xserv.h>
#include <xserv/xserv.hpp>

#include <cstring>

int main() {
  xserv_model_params mp = xserv_model_default_params();
  (void)mp;
  xserv::GenerateOptions options;
  (void)options;
  return std::strlen(xserv_version()) > 0 && !xserv::version().empty() ? 0 : 1;
}
