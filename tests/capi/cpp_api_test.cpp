// The public C++ API (include/xserv/xserv.hpp) as a user sees it: linked against libxserv only,
// compiled as C++17. Exceptions, RAII, callbacks that stop or throw.
#include <xserv/xserv.hpp>

#include "cxx_check.hpp"

#include <cstdio>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <utility>
#include <vector>

namespace {

void test_errors() {
  CHECK(status_of([] { xserv::Model::load("/nonexistent/model"); }) == XSERV_ERR_NOT_FOUND);
  try {
    xserv::Model::load("/nonexistent/model");
  } catch (const xserv::Error& e) {
    CHECK(std::string(e.what()).find("/nonexistent/model") != std::string::npos);
    CHECK(std::string(e.status_name()) == "not found");
  }
}

void test_model() {
  xserv::ModelOptions mo;
  mo.device = xserv::Device::cpu;
  int calls = 0;
  mo.on_progress = [&](float) {
    ++calls;
    return true;
  };
  xserv::Model model = xserv::Model::load(kModel, mo);
  CHECK(calls >= 2);
  CHECK(model.arch() == "gpt2" && model.device() == "cpu" && model.n_vocab() == 50257);
  CHECK(!model.has_chat_template());
  // ModelOptions::kv_cache_dtype reaches the load: the CPU reads no f16 cache.
  xserv::ModelOptions f16_kv;
  f16_kv.device = xserv::Device::cpu;
  f16_kv.kv_cache_dtype = xserv::DType::f16;
  CHECK(status_of([&] { xserv::Model::load(kModel, f16_kv); }) == XSERV_ERR_UNSUPPORTED);

  // Tokenizer helpers; a text longer than the first buffer guess exercises the retry.
  std::string text;
  for (int i = 0; i < 50; ++i) text += "O Romeo, Romeo! wherefore art thou Romeo? ";
  const std::vector<std::int32_t> ids = model.tokenize(text);
  CHECK(ids.size() > 100);
  CHECK(model.detokenize(ids) == text);
  CHECK(model.tokenize("<|endoftext|>").size() == 1);
  CHECK(model.tokenize("<|endoftext|>", false).size() > 1);
  CHECK(status_of([&] { model.tokenize("\xff"); }) == XSERV_ERR_INVALID_ARGUMENT);
  CHECK(status_of([&] { model.apply_chat_template({{"user", "hi"}}); }) == XSERV_ERR_UNSUPPORTED);
  // Without a template the contents are joined, typed specials stay text; the retry path too.
  CHECK(model.tokenize_chat({{"user", "a<|endoftext|>"}, {"user", "b"}}) ==
        model.tokenize("a<|endoftext|>\nb", false));
  CHECK(model.tokenize_chat({{"user", text}}) == model.tokenize(text, false));

  // Streaming generation: the events add up to the returned text.
  xserv::GenerateOptions go;
  go.temperature = 0;
  go.max_tokens = 20;
  go.ignore_eos = true;
  std::string streamed;
  int events = 0;
  xserv::FinishReason last = xserv::FinishReason::none;
  const std::string out = model.generate("ROMEO:", go, [&](const xserv::TokenEvent& e) {
    streamed += e.text;
    ++events;
    last = e.finish;
    return true;
  });
  CHECK(!out.empty() && out == streamed && events == 20 && last == xserv::FinishReason::length);
  CHECK(model.generate("ROMEO:", go) == out);

  // Stopping from the callback.
  events = 0;
  model.generate("ROMEO:", go, [&](const xserv::TokenEvent&) { return ++events < 4; });
  CHECK(events == 4);

  // An exception thrown by the callback stops generation and comes out of generate().
  bool caught = false;
  try {
    model.generate("ROMEO:", go, [](const xserv::TokenEvent&) -> bool {
      throw std::runtime_error("from the callback");
    });
  } catch (const std::runtime_error& e) {
    caught = std::string(e.what()) == "from the callback";
  }
  CHECK(caught);

  // Bad options come back as Error naming the field.
  go.top_p = 2.0f;
  CHECK(status_of([&] { model.generate("ROMEO:", go); }) == XSERV_ERR_INVALID_ARGUMENT);

  // Moves transfer ownership; the moved-from object is empty and harmless.
  xserv::Model moved = std::move(model);
  CHECK(moved.get() != nullptr && model.get() == nullptr);
  CHECK(moved.n_layer() > 0);
  CHECK(status_of([&] { (void)model.arch(); }) == XSERV_ERR_INVALID_ARGUMENT);

  // Cancelling a load from the progress callback, by return value and by exception.
  mo.on_progress = [](float) { return false; };
  CHECK(status_of([&] { xserv::Model::load(kModel, mo); }) == XSERV_ERR_CANCELLED);
  mo.on_progress = [](float) -> bool { throw std::logic_error("stop loading"); };
  caught = false;
  try {
    xserv::Model::load(kModel, mo);
  } catch (const std::logic_error&) {
    caught = true;
  }
  CHECK(caught);
}

}  // namespace

int main() {
  test_errors();
  struct stat st;
  if (stat((kModel + "/model.safetensors").c_str(), &st) == 0) {
    test_model();
  } else {
    std::printf("cpp_api_test: the embedded model is missing, model tests skipped\n");
  }
  return report_checks("cpp_api_test");
}
