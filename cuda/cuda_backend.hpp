// The CUDA backend: every Backend op on one NVIDIA GPU (see cuda_backend.cpp for the design).
#pragma once

#include <memory>

#include "backend/backend.hpp"

namespace xserv::cuda {

// Throws Error(cuda) when the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
// True when a CUDA device is visible and the driver works.
bool device_available() noexcept;

}  // namespace xserv::cuda
