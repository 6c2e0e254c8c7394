// Communicator: the one collective tensor parallelism needs, an in-place sum over ranks.
//
// A tensor-parallel model (docs/parallel.md) runs one shard per rank; each row-parallel GEMM
// leaves a partial sum on every rank, and all_reduce_sum makes every rank hold the total. Two
// implementations sit behind this interface:
// - make_host_communicators(): N ranks of one process, each driven by its own thread, summing
//   host tensors (the CPU backend). It is the reference the CPU tests run in CI.
// - make_nccl_communicators() (nccl_communicator.hpp): NCCL over the GPUs of one host, loaded
//   with dlopen at run time, so nothing here needs nccl.h or libnccl to build.
//
// Contract: every rank calls all_reduce_sum with a tensor of the same dtype and element count,
// in the same order (collectives are matched by order, not by name). A communicator is used by
// one thread at a time (its rank's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tensor/buffer.hpp"

namespace xserv {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // t = the sum of t over all ranks, in place, the same values on every rank. Host
  // communicators return when done; device ones enqueue on their stream (and are recorded into a
  // CUDA graph being captured on it), like a Backend op. f32, f16 and bf16.
  virtual void all_reduce_sum(Tensor t) = 0;
  // Wakes every rank blocked in (or later entering) all_reduce_sum with Error(cancelled): a rank
  // that failed calls it so that its peers do not wait for it forever. Best effort for NCCL.
  virtual void abort() noexcept {}
  // Once every rank has returned (none is inside all_reduce_sum), makes an aborted group usable
  // again: a failure that every rank saw before its next collective (a bad batch) leaves the
  // collectives in step. No-op for NCCL.
  virtual void reset() noexcept {}
};

// `size` communicators of one process for host memory; rank r's must be used by one thread,
// all ranks concurrently. Sums in rank order (0, 1, ...) in f32, so every rank gets the same
// bits. Throws Error(invalid_argument) when size < 1.
std::vector<std::unique_ptr<Communicator>> make_host_communicators(int size);

}  // namespace xserv
