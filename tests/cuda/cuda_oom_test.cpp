// Device memory exhausted while a model loads: Model::load of a checkpoint larger than the GPU
// fails with Error(out_of_memory) naming the sizes, gives back every device byte it took, and
// the process goes on: a model loaded before gives the same logits, and a new one loads.
//
// The checkpoint is sparse (a 512 GiB token embedding, [2^30, 128] f32, that occupies no disk):
// the failing cudaMalloc comes before any of it is read. The C API side of the same case (status
// XSERV_ERR_OUT_OF_MEMORY, the host loads and generates afterwards) is in
// tests/capi/capi_hostile_test.c.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "cuda_test_util.hpp"
#include "kv/kv_cache.hpp"
#include "models/model.hpp"
#include "models/tiny_models.hpp"
#include "support/golden.hpp"
#include "support/temp_dir.hpp"

using namespace xserv;

namespace {

// A tiny GPT-2 (128 wide, 2 layers) whose embedding has 2^30 rows: a header with every tensor,
// the small tensors' bytes, and the file extended (sparse) to the embedding's end.
void write_huge_checkpoint(const test::TempDir& dir) {
  constexpr std::int64_t vocab = std::int64_t{1} << 30, d = 128;
  dir.write("config.json", test::tiny_gpt2_config(static_cast<int>(vocab), d, 2, 2, 64));
  test::SafetensorsWriter small = test::tiny_gpt2_weights("transformer.", 1, d, 2, 64);
  std::string header = "{";
  std::size_t offset = 0;
  for (const auto& e : small.entries) {
    if (e.name == "transformer.wte.weight") continue;
    header += fmt::format(R"("{}":{{"dtype":"F32","shape":[{}],"data_offsets":[{},{}]}},)", e.name,
                          fmt::join(e.shape, ","), offset, offset + e.bytes.size());
    offset += e.bytes.size();
  }
  const std::size_t wte_bytes = static_cast<std::size_t>(vocab * d * 4);
  header += fmt::format(R"("transformer.wte.weight":{{"dtype":"F32","shape":[{},{}],"data_offsets":[{},{}]}}}})",
                        vocab, d, offset, offset + wte_bytes);
  while (header.size() % 8) header += ' ';
  std::string data;
  for (const auto& e : small.entries)
    if (e.name != "transformer.wte.weight") data += e.bytes;
  const std::string path = dir.write("model.safetensors", test::SafetensorsWriter::file(header, data));
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(8 + header.size() + offset + wte_bytes)) == 0);
}

std::size_t device_free_bytes() {
  std::size_t free_bytes = 0, total = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess);
  return free_bytes;
}

std::vector<float> logits_of(Model& model, Backend& backend) {
  kv::KvCache cache(backend, model.kv_spec(), {4, 16, 0});
  kv::BlockTable table(16);
  const std::vector<std::int32_t> prompt = {1, 5, 9, 2};
  table.ensure_capacity(cache.blocks(), static_cast<std::int32_t>(prompt.size()));
  Tensor logits = model.forward(test::prefill_batch(prompt, table, {3}), cache);
  std::vector<float> out(static_cast<std::size_t>(logits.numel()));
  backend.download(out.data(), logits);
  table.release(cache.blocks());
  return out;
}

}  // namespace

TEST_CASE("cuda: a checkpoint larger than the device is out_of_memory and frees what it took",
          "[cuda]") {
  XSERV_REQUIRE_CUDA_DEVICE();
  auto small_backend = cuda::make_cuda_backend({});
  auto small = Model::load(XSERV_TEST_DATA_DIR "/models/tiny-gpt2", *small_backend);
  const std::vector<float> before = logits_of(*small, *small_backend);

  test::TempDir dir;
  write_huge_checkpoint(dir);
  const std::size_t free_before = device_free_bytes();
  {
    auto backend = cuda::make_cuda_backend({});
    try {
      Model::load(dir.path().string(), *backend);
      FAIL("a 512 GiB embedding loaded");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(e.code() == ErrorCode::out_of_memory);
      CHECK_THAT(e.what(), Catch::Contains("out of device memory"));
    }
  }
  // Everything the failed load and its backend took is back (the CUDA context's own pools may
  // keep a little: 64 MiB of slack).
  CHECK(device_free_bytes() + (std::size_t{64} << 20) >= free_before);

  // The process goes on: the earlier model still computes the same logits, a new model loads.
  CHECK(logits_of(*small, *small_backend) == before);
  auto backend = cuda::make_cuda_backend({});
  auto again = Model::load(XSERV_TEST_DATA_DIR "/models/tiny-gpt2", *backend);
  CHECK(logits_of(*again, *backend) == before);
}
