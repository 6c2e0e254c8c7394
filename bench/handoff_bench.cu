// What a kernel-to-kernel hand-off costs on the GPU, by how the consumer learns its input is ready.
// Batch-1 decode of the small Qwen3 models is a chain of ~5 dependent kernels a layer, each a few
// microseconds (docs/benchmarks.md, "Batch-1 decode of Qwen3-1.7B: a CUPTI profile"), so the time
// from a producer's last write to its consumer's first read is paid ~140 times a token. This
// measures that time for a pair shaped like the decode attention and the o_proj (8 producer
// blocks, 256 consumer blocks, 2048 floats handed each way), chained N times in one CUDA graph:
//   plain   stream order, no programmatic dependent launch (PDL)
//   pdl     PDL; each kernel waits with griddepcontrol.wait, then lets the next one launch (the
//           rule of cuda/common.cuh: at most two kernels of the chain overlap)
//   flags   PDL launch as above, but the consumer waits for release/acquire counters the
//           producer's blocks bump after their writes (behind a full fence), not for the
//           producer grid's completion
//   release the same counters bumped without the fence (the release add alone)
//   none    PDL, no wait at all (wrong data; the launch-throughput floor the others approach)
// Usage: handoff_bench [--pairs N] [--work N]   (--work: dependent multiply-adds a thread does
// before writing, to give the producer a body; default 0)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/common.cuh"
#include "cuda_graph_timer.hpp"

namespace {

constexpr int threads = 256;
constexpr int producer_blocks = 8;
constexpr int consumer_blocks = 256;
constexpr int width = producer_blocks * threads;  // 2048 floats each way
static_assert(consumer_blocks * 8 == width, "each consumer block writes 8 floats");

enum class Mode { plain, pdl, flags, release, none };

__device__ __forceinline__ void pdl_allow() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Waits until *counter >= target (one thread polls with acquire loads; the block barrier orders
// the other threads' reads after it), then lets the next kernel launch.
__device__ __forceinline__ void counter_wait(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  __syncthreads();
  pdl_allow();
}

// After the block's last write: the barrier, then one release add by thread 0, behind a full
// fence (Fence, as cooperative groups' grid sync does) or not.
template <bool Fence>
__device__ __forceinline__ void counter_signal(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if constexpr (Fence) __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
  }
}

template <Mode M>
__device__ __forceinline__ void enter(const unsigned* counter, unsigned target) {
  if constexpr (M == Mode::pdl) xserv::cuda::grid_dependency_wait();  // the decode kernels' wait
  else if constexpr (M == Mode::flags || M == Mode::release) counter_wait(counter, target);
  else if constexpr (M == Mode::none) pdl_allow();
}

template <Mode M>
__device__ __forceinline__ void leave(unsigned* counter) {
  if constexpr (M == Mode::flags || M == Mode::release) counter_signal<M == Mode::flags>(counter);
}

// The "attention": each block reads the whole 2048-float input (as the attention reads q), does
// `work` dependent multiply-adds, writes its 256 outputs.
template <Mode M>
__global__ void producer(const float* x, float* y, unsigned* counters, unsigned pair, int work) {
  enter<M>(&counters[1], pair * consumer_blocks);
  __shared__ float part[threads / 32];
  float s = 0;
  for (int i = threadIdx.x; i < width; i += threads) s += x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  float v = part[threadIdx.x % (threads / 32)] * 1e-3f + static_cast<float>(threadIdx.x);
  for (int i = 0; i < work; ++i) v = fmaf(v, 0.999f, 1e-3f);
  y[blockIdx.x * threads + threadIdx.x] = v;
  leave<M>(&counters[0]);
}

// The "o_proj": each block reads the producer's 2048 outputs, writes 8 sums.
template <Mode M>
__global__ void consumer(const float* y, float* x, unsigned* counters, unsigned pair) {
  enter<M>(&counters[0], (pair + 1) * producer_blocks);
  __shared__ float part[threads / 32];
  float s = 0;
  for (int i = threadIdx.x; i < width; i += threads) s += y[i] * static_cast<float>(i % 7);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 8) x[blockIdx.x * 8 + threadIdx.x] = part[threadIdx.x] * 1e-6f;
  leave<M>(&counters[1]);
}

template <Mode M>
double us_per_handoff(cudaStream_t stream, float* x, float* y, unsigned* counters, int pairs, int work) {
  const bool pdl = M != Mode::plain;
  return xserv::bench::graph_us_per_launch(stream, 2 * static_cast<std::size_t>(pairs), [&] {
    // The counters restart with every replay; the first producer's wait (pair 0) is met at once.
    xserv::bench::cuda_check(cudaMemsetAsync(counters, 0, 2 * sizeof(unsigned), stream), "memset");
    for (int p = 0; p < pairs; ++p) {
      xserv::cuda::launch_kernel(pdl, producer<M>, dim3(producer_blocks), dim3(threads), 0, stream, x, y,
                                 counters, static_cast<unsigned>(p), work);
      xserv::cuda::launch_kernel(pdl, consumer<M>, dim3(consumer_blocks), dim3(threads), 0, stream, y, x,
                                 counters, static_cast<unsigned>(p));
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  int pairs = 200, work = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--pairs" && i + 1 < argc) pairs = std::atoi(argv[++i]);
    else if (a == "--work" && i + 1 < argc) work = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: handoff_bench [--pairs N] [--work N]\n");
      return 2;
    }
  }
  if (pairs < 1 || pairs > 100000 || work < 0) {
    std::fprintf(stderr, "handoff_bench: --pairs 1..100000, --work >= 0\n");
    return 2;
  }
  cudaStream_t stream;
  xserv::bench::cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  float *x = nullptr, *y = nullptr;
  unsigned* counters = nullptr;
  xserv::bench::cuda_check(cudaMalloc(&x, width * sizeof(float)), "malloc");
  xserv::bench::cuda_check(cudaMalloc(&y, width * sizeof(float)), "malloc");
  xserv::bench::cuda_check(cudaMalloc(&counters, 2 * sizeof(unsigned)), "malloc");
  xserv::bench::cuda_check(cudaMemset(x, 0, width * sizeof(float)), "memset");
  cudaDeviceProp prop{};
  xserv::bench::cuda_check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("%s, %d SMs; %d pairs of %d + %d blocks, work %d\n", prop.name, prop.multiProcessorCount,
              pairs, producer_blocks, consumer_blocks, work);
  std::printf("| mode | us a kernel (3 graph replays) |\n| --- | ---: |\n");
  for (int round = 0; round < 2; ++round) {
    std::printf("| plain | %.3f |\n", us_per_handoff<Mode::plain>(stream, x, y, counters, pairs, work));
    std::printf("| pdl | %.3f |\n", us_per_handoff<Mode::pdl>(stream, x, y, counters, pairs, work));
    std::printf("| flags | %.3f |\n", us_per_handoff<Mode::flags>(stream, x, y, counters, pairs, work));
    std::printf("| release | %.3f |\n", us_per_handoff<Mode::release>(stream, x, y, counters, pairs, work));
    std::printf("| none | %.3f |\n", us_per_handoff<Mode::none>(stream, x, y, counters, pairs, work));
  }
  xserv::bench::cuda_check(cudaStreamSynchronize(stream), "sync");
  cudaFree(x);
  cudaFree(y);
  cudaFree(counters);
  cudaStreamDestroy(stream);
  return 0;
}
