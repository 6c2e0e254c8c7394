// ModelGroup: one model split over the ranks of a tensor-parallel group (docs/parallel.md).
//
// Per rank: a backend (a CPU backend, or the CUDA backend of one GPU), a communicator (the
// in-process host one for the CPU, NCCL for CUDA) and a Model holding its Shard, loaded from
// the same checkpoint (each rank reads only its slices). run() runs a function on every rank at
// once, rank r on its own thread with its backend bound to it; the model runner uses it to run
// each forward on all ranks, then samples once from rank 0's logits. With size 1 it is just the
// model on one backend (no communicator, no extra thread).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "models/model.hpp"
#include "parallel/communicator.hpp"
#include "parallel/rank_workers.hpp"

namespace xserv {

struct ParallelOptions {
  DeviceKind device = DeviceKind::cpu;
  // Ranks. CUDA: the GPUs, devices[r] for rank r (empty: 0 .. size-1); CPU: ignored.
  int size = 1;
  std::vector<int> devices;
  // CPU: worker threads of each rank's backend (0: all hardware threads for one rank, the
  // hardware threads / size each for several).
  std::size_t threads = 0;
  // Optional: replaces rank r's backend, as made, by what it returns (benchmarks wrap one in a
  // timing decorator). The result must forward bind_thread() and native_stream().
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>, int rank)> wrap_backend;
};

class ModelGroup {
 public:
  // Creates the backends and communicators, then loads every rank's shard at once (warm-up
  // runs collectives, so the ranks load together). Throws Error(invalid_argument) for a size
  // < 1, a device list of another length or a model whose heads or inner size the size does not
  // divide; Error(cuda) when more ranks than GPUs are asked for; Error(unsupported) when NCCL
  // cannot be loaded; and what Model::load throws.
  static std::unique_ptr<ModelGroup> load(const std::string& dir, const ParallelOptions& parallel,
                                          const ModelOptions& options = {});
  ~ModelGroup();

  int size() const noexcept { return static_cast<int>(models_.size()); }
  Model& model(int rank) const { return *models_.at(static_cast<std::size_t>(rank)); }
  Backend& backend(int rank) const { return *backends_.at(static_cast<std::size_t>(rank)); }
  // Rank 0, which holds the head and returns the logits.
  Model& leader() const { return model(0); }

  // fn(rank) on every rank at once (RankWorkers); when a rank throws, the communicators are
  // aborted so that no peer waits for it, and the first error is rethrown. Thread-safe: calls
  // from several threads (engines sharing the model) take turns; fn must not call run().
  void run(const std::function<void(int rank)>& fn);

 private:
  ModelGroup() = default;

  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> models_;
  std::unique_ptr<RankWorkers> workers_;
  std::mutex run_mutex_;  // one run() at a time: RankWorkers is not reentrant
};

}  // namespace xserv
