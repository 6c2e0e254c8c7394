// The extern "C" facade over xserv's C++ internals. Every entry point catches everything: no
// exception crosses the C boundary, failures become an xserv_status plus a thread-local message.
#include "xserv.h"

#include <string>

#include "core/error.hpp"
#include "xserv/version.hpp"

static_assert(XSERV_VERSION_MAJOR == XSERV_PROJECT_VERSION_MAJOR &&
                  XSERV_VERSION_MINOR == XSERV_PROJECT_VERSION_MINOR &&
                  XSERV_VERSION_PATCH == XSERV_PROJECT_VERSION_PATCH,
              "capi/xserv.h and CMakeLists.txt disagree on the version");

namespace {
thread_local std::string g_last_error;
}  // namespace

extern "C" {

const char* xserv_version(void) { return XSERV_VERSION_STRING; }

const char* xserv_status_string(xserv_status status) {
  switch (status) {
    case XSERV_OK: return "ok";
    case XSERV_ERR_INVALID_ARGUMENT: return "invalid argument";
    case XSERV_ERR_NOT_FOUND: return "not found";
    case XSERV_ERR_IO: return "I/O error";
    case XSERV_ERR_FORMAT: return "format error";
    case XSERV_ERR_UNSUPPORTED: return "unsupported";
    case XSERV_ERR_OUT_OF_MEMORY: return "out of memory";
    case XSERV_ERR_RESOURCE_EXHAUSTED: return "resource exhausted";
    case XSERV_ERR_CUDA: return "CUDA error";
    case XSERV_ERR_CANCELLED: return "cancelled";
    case XSERV_ERR_BUFFER_TOO_SMALL: return "buffer too small";
    case XSERV_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* xserv_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
