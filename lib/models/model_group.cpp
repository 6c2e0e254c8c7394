#include "models/model_group.hpp"

#include <algorithm>
#include <thread>

#include "core/error.hpp"
#include "parallel/nccl_communicator.hpp"

namespace xserv {

namespace {

std::vector<int> rank_devices(const ParallelOptions& p) {
  XSERV_CHECK(p.size >= 1 && p.size <= 1024, ErrorCode::invalid_argument,
              "tensor-parallel size {} (expected 1 ..= 1024)", p.size);
  if (p.devices.empty()) {
    std::vector<int> d(static_cast<std::size_t>(p.size));
    for (int r = 0; r < p.size; ++r) d[static_cast<std::size_t>(r)] = r;
    return d;
  }
  XSERV_CHECK(static_cast<int>(p.devices.size()) == p.size, ErrorCode::invalid_argument,
              "tensor-parallel size {} with a list of {} devices", p.size, p.devices.size());
  return p.devices;
}

}  // namespace

std::unique_ptr<ModelGroup> ModelGroup::load(const std::string& dir,
                                             const ParallelOptions& parallel,
                                             const ModelOptions& options) {
  const std::vector<int> devices = rank_devices(parallel);
  const int size = parallel.size;
  std::unique_ptr<ModelGroup> g(new ModelGroup());
  BackendOptions bo;
  bo.threads = parallel.threads;
  if (parallel.device == DeviceKind::cpu && size > 1 && bo.threads == 0) {
    const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
    bo.threads = std::max<std::size_t>(1, hw / static_cast<std::size_t>(size));
  }
  for (int r = 0; r < size; ++r) {
    bo.device_index = devices[static_cast<std::size_t>(r)];
    try {
      std::unique_ptr<Backend> backend = make_backend(parallel.device, bo);
      if (parallel.wrap_backend) backend = parallel.wrap_backend(std::move(backend), r);
      g->backends_.push_back(std::move(backend));
    } catch (const Error& e) {
      if (size == 1) throw;
      throw_error(e.code(), "tensor-parallel rank {} of {}: {}", r, size, e.what());
    }
  }
  if (size > 1) {
    if (parallel.device == DeviceKind::cpu) {
      g->comms_ = make_host_communicators(size);
    } else {
      std::vector<void*> streams;
      for (auto& b : g->backends_) streams.push_back(b->native_stream());
      g->comms_ = make_nccl_communicators(devices, streams);
    }
  }
  g->workers_ = std::make_unique<RankWorkers>(size);
  g->models_.resize(static_cast<std::size_t>(size));
  g->run([&](int r) {
    ModelOptions o = options;
    o.communicator = size > 1 ? g->comms_[static_cast<std::size_t>(r)].get() : nullptr;
    if (r != 0) o.on_progress = nullptr;  // one progress report: rank 0's
    g->models_[static_cast<std::size_t>(r)] =
        Model::load(dir, *g->backends_[static_cast<std::size_t>(r)], o);
  });
  return g;
}

ModelGroup::~ModelGroup() {
  // Models (their workspaces and weights) go before the communicators and backends they use;
  // each rank's on its own thread, its device current (CUDA frees and handle teardown act on
  // the current device).
  auto on_ranks = [this](const std::function<void(std::size_t)>& fn) {
    auto each = [&](int r) {
      const auto i = static_cast<std::size_t>(r);
      if (i < backends_.size() && backends_[i]) backends_[i]->bind_thread();
      fn(i);
    };
    try {
      if (workers_) workers_->run(each);
      else for (int r = 0; r < static_cast<int>(backends_.size()); ++r) each(r);
    } catch (...) {  // a destructor reports nothing; what is left goes below
    }
  };
  on_ranks([this](std::size_t i) {
    if (i < models_.size()) models_[i].reset();
  });
  models_.clear();
  comms_.clear();
  on_ranks([this](std::size_t i) {
    if (i < backends_.size()) backends_[i].reset();
  });
  backends_.clear();
}

void ModelGroup::run(const std::function<void(int rank)>& fn) {
  std::lock_guard lock(run_mutex_);
  try {
    workers_->run(
        [&](int r) {
          backends_[static_cast<std::size_t>(r)]->bind_thread();
          fn(r);
        },
        [this] {
          for (auto& c : comms_) c->abort();
        });
  } catch (...) {
    for (auto& c : comms_) c->reset();  // every rank has returned
    throw;
  }
}

}  // namespace xserv
