// NCCL behind the Communicator interface, loaded at run time.
//
// libnccl.so.2 is opened with dlopen on first use (XSERV_NCCL_LIBRARY overrides the name), and
// the few entry points xserv calls are declared here from NCCL's documented C API (the ABI has
// been stable since NCCL 2.0): no nccl.h and no link-time dependency, so every build (CI has no
// NCCL: it is not in Debian) compiles and tests this file, and a machine without NCCL gets a
// clear Error(unsupported) only when it asks for more than one GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.hpp"

namespace xserv {

// True when libnccl.so.2 loads and has the functions xserv needs; otherwise false and *why
// (when given) says what failed. Thread-safe; the library stays loaded.
bool nccl_available(std::string* why = nullptr);

// One communicator per GPU of this process (ncclCommInitAll): rank r runs on CUDA device
// devices[r] and enqueues its collectives on streams[r] (a cudaStream_t of that device, e.g.
// Backend::native_stream()). Throws Error(unsupported) when NCCL cannot be loaded,
// Error(invalid_argument) for empty or mismatched lists or a device listed twice, Error(cuda)
// when NCCL fails (its message included).
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    const std::vector<int>& devices, const std::vector<void*>& streams);

}  // namespace xserv
