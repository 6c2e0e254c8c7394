// libFuzzer target: loading a model directory through the C ABI when one of its JSON files is
// arbitrary bytes: the embedded model's real weights and tokenizer beside a config.json,
// generation_config.json or tokenizer_config.json taken from the input (the first byte picks
// which; the other two are the real ones). A config whose sizes do not match the weights, that
// asks for absurd sizes, or is not JSON at all must fail with a status and a message (FORMAT,
// UNSUPPORTED, INVALID_ARGUMENT, OUT_OF_MEMORY), never crash, abort or allocate what it names
// before checking it against the weights. A model that loads must generate: two greedy tokens
// of a short prompt, the text valid as returned.
//
// Built by the `fuzz` preset (tests/fuzz/CMakeLists.txt): scripts/fuzz.sh ci 20 model_load
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "core/mapped_file.hpp"
#include "fuzz_support.hpp"
#include "xserv.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// An unexpected status is a finding: say which before aborting.
void require_status(bool ok, const char* call, xserv_status st) {
  if (ok) return;
  std::fprintf(stderr, "%s: unexpected status %s: %s\n", call, xserv_status_string(st), xserv_last_error());
  std::abort();
}

const std::string kModel = XSERV_SOURCE_DIR "/examples/models/shakespeare";
const char* const kJsonFiles[] = {"config.json", "generation_config.json", "tokenizer_config.json"};
std::string g_originals[3];

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The scratch model directory: links to the real weights and tokenizer files.
  const std::string& dir = xserv::fuzz::scratch_dir();
  for (const char* name : {"model.safetensors", "tokenizer.json", "vocab.json", "merges.txt"})
    require(::symlink((kModel + "/" + name).c_str(), (dir + "/" + name).c_str()) == 0);
  for (int i = 0; i < 3; ++i) g_originals[i] = xserv::read_file(kModel + "/" + kJsonFiles[i]);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int which = data[0] % 3;
  for (int i = 0; i < 3; ++i)
    xserv::fuzz::write_scratch(kJsonFiles[i], i == which ? std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)
                                                         : std::string_view(g_originals[i]));
  xserv_model_params mp = xserv_model_default_params();
  mp.device = XSERV_DEVICE_CPU;
  mp.n_threads = 1;
  xserv_model* model = nullptr;
  const xserv_status st = xserv_model_load(xserv::fuzz::scratch_dir().c_str(), &mp, &model);
  if (st != XSERV_OK) {
    require(model == nullptr);
    require_status(st == XSERV_ERR_FORMAT || st == XSERV_ERR_UNSUPPORTED || st == XSERV_ERR_INVALID_ARGUMENT ||
                       st == XSERV_ERR_OUT_OF_MEMORY,
                   "xserv_model_load", st);
    require(xserv_last_error() != nullptr && xserv_last_error()[0] != '\0');
    return 0;
  }
  xserv_generate_params gp = xserv_generate_default_params();
  gp.max_tokens = 2;
  gp.temperature = 0.0f;
  char* text = nullptr;
  const xserv_status gs = xserv_generate(model, "To be", &gp, nullptr, nullptr, &text);
  // Generation may refuse what the loaded config allows (say, a context too short for the
  // prompt), with a status; it must not fail otherwise.
  require_status(gs == XSERV_OK || gs == XSERV_ERR_INVALID_ARGUMENT || gs == XSERV_ERR_RESOURCE_EXHAUSTED,
                 "xserv_generate", gs);
  if (gs == XSERV_OK) require(text != nullptr);
  xserv_string_free(text);
  xserv_model_free(model);
  return 0;
}
