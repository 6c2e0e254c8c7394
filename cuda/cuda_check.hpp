// Turning CUDA runtime and cuBLASLt status codes into xserv::Error.
//
// Kept free of fmt/core headers: nvcc's front end is included from the .cu files too.
// Every runtime call of the backend goes through XSERV_CUDA_CHECK so a failure names the call
// and the driver's message; running out of device memory is Error(out_of_memory) so callers
// (the KV sizing, the C facade) can tell it from a broken device.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

namespace xserv::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call);

}  // namespace xserv::cuda

#define XSERV_CUDA_CHECK(call)                                                 \
  do {                                                                         \
    cudaError_t xserv_status_ = (call);                                        \
    if (xserv_status_ != cudaSuccess) ::xserv::cuda::throw_cuda_error(xserv_status_, #call); \
  } while (0)

#define XSERV_CUBLAS_CHECK(call)                                                       \
  do {                                                                                 \
    cublasStatus_t xserv_status_ = (call);                                             \
    if (xserv_status_ != CUBLAS_STATUS_SUCCESS)                                        \
      ::xserv::cuda::throw_cublas_error(xserv_status_, #call);                         \
  } while (0)

// After a kernel launch: a bad launch configuration surfaces here, not at the next sync.
#define XSERV_CUDA_LAUNCH_CHECK() XSERV_CUDA_CHECK(cudaGetLastError())
