// Helpers of the tensor-parallel tests (CPU and CUDA): a ModelGroup with one KV cache per rank,
// and one packed forward run on every rank at once, returning rank 0's logits.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "kv/kv_cache.hpp"
#include "models/model_group.hpp"

namespace xserv::test {

struct TpRun {
  std::unique_ptr<ModelGroup> group;
  std::vector<std::unique_ptr<kv::KvCache>> caches;  // one per rank, the same blocks

  TpRun(const std::string& dir, DeviceKind device, int size, std::int32_t max_batch_tokens = 64,
        kv::KvCacheOptions cache = {16, 16, 0}) {
    ParallelOptions p;
    p.device = device;
    p.size = size;
    p.threads = 1;
    ModelOptions o;
    o.max_batch_tokens = max_batch_tokens;
    group = ModelGroup::load(dir, p, o);
    caches.resize(static_cast<std::size_t>(size));
    group->run([&](int r) {  // each on its rank's thread, its device current
      caches[static_cast<std::size_t>(r)] =
          std::make_unique<kv::KvCache>(group->backend(r), group->model(r).kv_spec(), cache);
    });
  }

  // Block ids come from rank 0's pool (the engine's one scheduler uses it alone).
  kv::BlockPool& blocks() { return caches[0]->blocks(); }

  // Rank 0's f32 logits [R * vocab] of `b`, run on every rank at once.
  std::vector<float> forward(const ForwardBatch& b) {
    std::vector<float> out;
    std::vector<std::int64_t> rows(caches.size(), -1);
    group->run([&](int r) {  // no Catch2 assertion in here: Catch2 is not thread-safe
      Tensor logits = group->model(r).forward(b, *caches[static_cast<std::size_t>(r)]);
      rows[static_cast<std::size_t>(r)] = logits.shape[0];
      if (r != 0) return;
      out.resize(static_cast<std::size_t>(logits.numel()));
      group->backend(0).download(out.data(), logits);
    });
    for (std::size_t r = 1; r < rows.size(); ++r) CHECK(rows[r] == 0);  // the head: rank 0 only
    return out;
  }
};

}  // namespace xserv::test
