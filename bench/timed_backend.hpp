// TimedBackend: a Backend that forwards every call to another one and adds up the wall time of
// each op (gemm keyed by its shape and layout), for generate_bench --profile: where a decode
// step's time goes without a profiler. Each op is timed around the inner call, so on an
// asynchronous backend (CUDA) the figures are launch costs, not kernel times; on the CPU backend
// (ops run to completion) they are the ops' own times, thread hand-offs included.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"

namespace xserv::bench {

class TimedBackend final : public Backend {
 public:
  explicit TimedBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  struct Entry {
    double seconds = 0;
    std::int64_t calls = 0;
  };
  void reset() { entries_.clear(); }
  const std::map<std::string, Entry>& entries() const { return entries_; }

  // The ops sorted by time, each as microseconds per `steps` and calls per step.
  void print(double steps) const { print(entries_, steps); }
  static void print(const std::map<std::string, Entry>& entries, double steps) {
    std::vector<std::pair<std::string, Entry>> v(entries.begin(), entries.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
    double total = 0;
    for (auto& [k, e] : v) total += e.seconds;
    std::printf("| op | us per step | calls per step | share |\n| --- | ---: | ---: | ---: |\n");
    for (auto& [k, e] : v)
      std::printf("| %s | %.1f | %.1f | %.1f%% |\n", k.c_str(), 1e6 * e.seconds / steps,
                  static_cast<double>(e.calls) / steps, 100 * e.seconds / total);
    std::printf("| all ops | %.1f | | |\n", 1e6 * total / steps);
  }

  Device device() const noexcept override { return inner_->device(); }
  std::string name() const override { return inner_->name() + " (timed)"; }
  DType activation_dtype(DType w) const noexcept override { return inner_->activation_dtype(w); }
  Allocator& allocator() noexcept override { return inner_->allocator(); }
  Tensor import_weight(const Tensor& host) override { return inner_->import_weight(host); }
  void reserve_adjacent_weights(std::span<const std::size_t> bytes) override {
    inner_->reserve_adjacent_weights(bytes);
  }
  void upload(Tensor dst, const void* src) override { time("upload", [&] { inner_->upload(dst, src); }); }
  void download(void* dst, const Tensor& src) override {
    time("download", [&] { inner_->download(dst, src); });
  }
  void fill_zero(Tensor dst) override { time("fill_zero", [&] { inner_->fill_zero(dst); }); }
  void copy(Tensor dst, const Tensor& src) override { time("copy", [&] { inner_->copy(dst, src); }); }
  void transpose(Tensor dst, const Tensor& src) override {
    time("transpose", [&] { inner_->transpose(dst, src); });
  }
  MemoryInfo memory_info() const override { return inner_->memory_info(); }
  DeviceBatch upload_batch(const ForwardBatch& batch) override {
    DeviceBatch b;
    time("upload_batch", [&] { b = inner_->upload_batch(batch); });
    return b;
  }
  void synchronize() override { time("synchronize", [&] { inner_->synchronize(); }); }
  void bind_thread() override { inner_->bind_thread(); }
  void* native_stream() noexcept override { return inner_->native_stream(); }
  void embedding(Tensor out, const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                 const Tensor& positions) override {
    time("embedding", [&] { inner_->embedding(out, ids, table, pos_table, positions); });
  }
  void layer_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                  const Tensor& bias, float eps) override {
    time("layer_norm", [&] { inner_->layer_norm(out, x, residual, weight, bias, eps); });
  }
  void rms_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                float eps) override {
    time("rms_norm", [&] { inner_->rms_norm(out, x, residual, weight, eps); });
  }
  void gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout, const Tensor& bias,
            float beta, std::int64_t out_row_stride) override {
    const char* l = layout == WeightLayout::out_in    ? "out_in"
                    : layout == WeightLayout::panel32 ? "panel32"
                                                      : "in_out";
    const std::string key = fmt::format("gemm {} M={} {} {}", l, a.shape[0], w.shape, dtype_name(w.dtype));
    time(key, [&] { inner_->gemm(out, a, w, layout, bias, beta, out_row_stride); });
  }
  void gemm_parts(Tensor out, const Tensor& a, std::span<const Tensor> ws,
                  std::span<const Tensor> biases) override {
    std::string shapes;
    for (const Tensor& w : ws) shapes += fmt::format("{}{}", shapes.empty() ? "" : " + ", w.shape);
    const std::string key = fmt::format("gemm_parts M={} {} {}", a.shape[0], shapes,
                                        ws.empty() ? "" : dtype_name(ws[0].dtype));
    time(key, [&] { inner_->gemm_parts(out, a, ws, biases); });
  }
  void rms_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight, float eps,
                     const Tensor& w, bool swiglu, Tensor h_scratch, Tensor y_scratch) override {
    // Through the base implementation, so its rms_norm / gemm / swiglu steps are timed one by one.
    Backend::rms_norm_gemm(out, x, norm_weight, eps, w, swiglu, h_scratch, y_scratch);
  }
  void layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                       const Tensor& norm_bias, float eps, const Tensor& w, WeightLayout layout,
                       const Tensor& bias, bool gelu, Tensor h_scratch) override {
    // Through the base implementation, so its steps are timed one by one.
    Backend::layer_norm_gemm(out, x, norm_weight, norm_bias, eps, w, layout, bias, gelu, h_scratch);
  }
  void qk_transform_store(Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                          const DeviceBatch& batch, KvLayer cache) override {
    time("qk_transform_store", [&] { inner_->qk_transform_store(qkv, heads, t, batch, cache); });
  }
  void attention(Tensor out, const Tensor& qkv, const HeadGeometry& heads, const DeviceBatch& batch,
                 const KvLayer& cache, float scale) override {
    time("attention", [&] { inner_->attention(out, qkv, heads, batch, cache, scale); });
  }
  void qk_attention(Tensor out, Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                    const DeviceBatch& batch, KvLayer cache, float scale) override {
    time("qk_attention", [&] { inner_->qk_attention(out, qkv, heads, t, batch, cache, scale); });
  }
  void prefetch_next(const Tensor& w) override { inner_->prefetch_next(w); }  // a hint: not timed
  void gelu(Tensor x) override { time("gelu", [&] { inner_->gelu(x); }); }
  void swiglu(Tensor out, const Tensor& gate_up) override {
    time("swiglu", [&] { inner_->swiglu(out, gate_up); });
  }
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override {
    time("gather_rows", [&] { inner_->gather_rows(out, x, rows); });
  }
  void sample(Tensor logits, const SamplingBatch& params, std::int32_t* out_ids) override {
    time("sample", [&] { inner_->sample(logits, params, out_ids); });
  }
  std::uint64_t sample_async(Tensor logits, const SamplingBatch& params, Tensor ids_out) override {
    std::uint64_t ticket = 0;
    time("sample_async", [&] { ticket = inner_->sample_async(logits, params, ids_out); });
    return ticket;
  }
  void wait_sampled(std::uint64_t ticket, std::int32_t* out_ids) override {
    time("wait_sampled", [&] { inner_->wait_sampled(ticket, out_ids); });
  }
  void resolve_tokens(Tensor tokens, const Tensor& sampled) override {
    time("resolve_tokens", [&] { inner_->resolve_tokens(tokens, sampled); });
  }
  bool samples_async() const noexcept override { return inner_->samples_async(); }
  DeviceBatch upload_decode_batch(const ForwardBatch& batch, std::int32_t growing) override {
    DeviceBatch d;
    time("upload_decode_batch", [&] { d = inner_->upload_decode_batch(batch, growing); });
    return d;
  }
  void prepare_decode(const DeviceBatch& batch, const Tensor& sampled) override {
    time("prepare_decode", [&] { inner_->prepare_decode(batch, sampled); });
  }
  bool keeps_decode_batches() const noexcept override { return inner_->keeps_decode_batches(); }
  void logprobs(const Tensor& logits, const std::int32_t* ids, std::int32_t top_n,
                float* out_logprobs, std::int32_t* out_top_ids, float* out_top_logprobs) override {
    time("logprobs", [&] {
      inner_->logprobs(logits, ids, top_n, out_logprobs, out_top_ids, out_top_logprobs);
    });
  }
  void run_graph(std::uint64_t key, const std::function<void()>& ops) override {
    inner_->run_graph(key, ops);
  }
  bool records_graphs() const noexcept override { return inner_->records_graphs(); }
  void set_warming_up(bool on) override { inner_->set_warming_up(on); }
  std::size_t recorded_graphs() const noexcept override { return inner_->recorded_graphs(); }

 private:
  template <typename F>
  void time(const std::string& key, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    Entry& e = entries_[key];
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++e.calls;
  }

  std::unique_ptr<Backend> inner_;
  std::map<std::string, Entry> entries_;
};

}  // namespace xserv::bench
