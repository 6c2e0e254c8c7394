#include "core/error.hpp"

namespace xserv {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid argument";
    case ErrorCode::not_found: return "not found";
    case ErrorCode::io: return "I/O error";
    case ErrorCode::format: return "format error";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::out_of_memory: return "out of memory";
    case ErrorCode::resource_exhausted: return "resource exhausted";
    case ErrorCode::cuda: return "CUDA error";
    case ErrorCode::cancelled: return "cancelled";
    case ErrorCode::internal: return "internal error";
  }
  return "unknown error";
}

}  // namespace xserv
