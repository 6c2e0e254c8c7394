#include "cuda/cuda_check.hpp"

#include <cstdlib>
#include <string_view>

#include "core/error.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {

void throw_cuda_error(cudaError_t status, const char* call) {
  // Clear the sticky-free error state so later calls are not blamed for this one.
  (void)cudaGetLastError();
  const ErrorCode code = status == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::cuda;
  throw_error(code, "CUDA error in {}: {} ({})", call, cudaGetErrorString(status),
              cudaGetErrorName(status));
}

void throw_cublas_error(cublasStatus_t status, const char* call) {
  const ErrorCode code = status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorCode::out_of_memory : ErrorCode::cuda;
  throw_error(code, "cuBLASLt error in {}: {} ({})", call, cublasLtGetStatusString(status),
              cublasLtGetStatusName(status));
}

bool pdl_enabled() noexcept {
  static const bool enabled = [] {
    const char* env = std::getenv("XSERV_CUDA_PDL");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return enabled;
}

bool small_kernels_pdl() noexcept {
  static const bool enabled = [] {
    const char* env = std::getenv("XSERV_CUDA_SMALL_PDL");
    return pdl_enabled() && (env == nullptr || std::string_view(env) != "0");
  }();
  return enabled;
}

std::int64_t pdl_gemv_max_bytes() noexcept {
  static const std::int64_t bytes = [] {
    const char* env = std::getenv("XSERV_CUDA_PDL_GEMV_MB");
    return std::int64_t{env != nullptr ? std::atoi(env) : 32} << 20;
  }();
  return bytes;
}

}  // namespace xserv::cuda
