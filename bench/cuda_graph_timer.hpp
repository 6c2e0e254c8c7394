// Shared by the CUDA kernel benchmarks (gemv_bench, gemm_bench): time a sequence of launches as
// one CUDA graph, so the figure is the kernels' back-to-back time as a decode step replays them,
// not the host's launch overhead.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace xserv::bench {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// Captures enqueue() (which issues `launches` kernels on `stream`) into a graph, replays it once
// to warm up and 3 times timed; returns microseconds per launch.
template <typename Enqueue>
double graph_us_per_launch(cudaStream_t stream, std::size_t launches, Enqueue&& enqueue) {
  cudaGraph_t graph = nullptr;
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "capture");
  enqueue();
  cuda_check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  cuda_check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  cuda_check(cudaGraphLaunch(exec, stream), "warm-up");
  cuda_check(cudaEventRecord(a, stream), "record");
  constexpr int replays = 3;
  for (int r = 0; r < replays; ++r) cuda_check(cudaGraphLaunch(exec, stream), "replay");
  cuda_check(cudaEventRecord(b, stream), "record");
  cuda_check(cudaEventSynchronize(b), "sync");
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  return 1000.0 * ms / (replays * static_cast<double>(launches));
}

}  // namespace xserv::bench
