#include "cuda/cuda_check.hpp"

#include "core/error.hpp"

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

}  // namespace xserv::cuda
