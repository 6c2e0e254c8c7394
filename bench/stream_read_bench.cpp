// stream_read_bench: the streaming-read bandwidth ceiling of the cores this process may run on,
// the number decode at batch 1 is held against (each token reads every weight once).
//
//   stream_read_bench [--threads N] [--mb SIZE] [--repeat R] [--prefetch MODE] [--nta-after MB]
//                     [--flush-after MB] [--huge 1]
//
// N threads (default: every core in the affinity mask, so `taskset -c 0-7 stream_read_bench`
// measures those 8 cores) each sum their own contiguous slice of one SIZE-MB buffer (default
// 1024, far past any cache) with independent 16-byte vector accumulators; the buffer is written
// once first so every page is resident. Prints the best GB/s (10^9 bytes) of R passes (default
// 5), each pass timed from a common start to the last thread's end.
// Software prefetch in the read loop: without --prefetch, 4 KB ahead into L1 (the ceiling every
// earlier figure was measured with); --prefetch MODE prefetches as a decode GEMV does with
// XSERV_CPU_GEMV_PREFETCH=MODE (l1: 4 KB ahead into L1, as without the flag; off: none; l2:KB:
// KB ahead into L2 only, prefetcht1; both:KB: both), so the ceiling is read the way the GEMVs
// read.
// --nta-after MB: the L3 question (a decode reads the same weights every token, and the GPU
// machine's Xeon has a ~300 MB L3, a desktop's 32-128 MB): only the first MB of the buffer (each
// thread the first MB / N of its slice) is read as above; the rest is prefetched with
// prefetchnta 4 KB ahead and no L2 prefetch, which on Intel fills L1 only, so those lines should
// not displace the first MB from L3 between passes. The passes then show whether a fixed part of
// a buffer larger than L3 stays there (the median pass next to the best).
// --flush-after MB: the same question another way: the first MB read as above, every line past
// it evicted from the whole cache hierarchy (clflushopt) right after it was read, at the normal
// prefetch's speed, so nothing past it competes with the first MB for L3.
// --huge 1: the buffer on transparent huge pages (madvise(MADV_HUGEPAGE) on a 2 MB-aligned
// mapping, as the CPU backend's allocator does with XSERV_CPU_HUGEPAGES=1); "huge pages: N MB"
// says how much of the process's memory the kernel gave as huge pages (AnonHugePages).
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

typedef float v4 __attribute__((vector_size(16)));

struct Prefetch {
  bool l1 = true;              // 4 KB ahead into L1 (prefetcht0)
  std::size_t l2_floats = 0;   // this far ahead into L2 (prefetcht1), 0: not at all
};

// MODE as XSERV_CPU_GEMV_PREFETCH reads it; false when it is none of those.
bool parse_prefetch(const std::string& mode, Prefetch& p) {
  if (mode == "l1") return p = {true, 0}, true;
  if (mode == "off") return p = {false, 0}, true;
  const bool both = mode.rfind("both", 0) == 0;
  if (!both && mode.rfind("l2", 0) != 0) return false;
  const std::size_t colon = mode.find(':');
  const long kb = colon == std::string::npos ? 32 : std::atol(mode.c_str() + colon + 1);
  if (kb <= 0) return false;
  p = {both, static_cast<std::size_t>(kb) * 1024 / sizeof(float)};
  return true;
}

// Sum of floats [b, e) with 8 independent accumulators (the loads, not the adds, must bound it),
// prefetching in software as the GEMV kernels do: without any, one core of the GPU machine's
// Xeon reads less than xserv's own decode, which is no ceiling. The L2 prefetch stops at the
// slice's end, as the GEMV's stops at its tile's.
__attribute__((target("clflushopt"))) void flush_lines(const float* p) {
  __builtin_ia32_clflushopt(p);
  __builtin_ia32_clflushopt(p + 16);
}

float sum_slice(const float* p, std::size_t n, const Prefetch& pf, std::size_t nta_from,
                std::size_t flush_from) {
  v4 acc[8] = {};
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (i >= nta_from) {
      __builtin_prefetch(p + i + 1024, 0, 0);
      __builtin_prefetch(p + i + 1024 + 16, 0, 0);
    } else if (pf.l1) {
      __builtin_prefetch(p + i + 1024);
      __builtin_prefetch(p + i + 1024 + 16);
    }
    if (pf.l2_floats && i < nta_from && i + pf.l2_floats + 32 <= n) {
      __builtin_prefetch(p + i + pf.l2_floats, 0, 2);
      __builtin_prefetch(p + i + pf.l2_floats + 16, 0, 2);
    }
    for (int j = 0; j < 8; ++j) {
      v4 x;
      std::memcpy(&x, p + i + 4 * j, sizeof x);
      acc[j] += x;
    }
    if (i >= flush_from) flush_lines(p + i);
  }
  float s = 0.0f;
  for (auto& a : acc) s += a[0] + a[1] + a[2] + a[3];
  for (; i < n; ++i) s += p[i];
  return s;
}

std::size_t cores_in_mask() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return std::thread::hardware_concurrency();
  return static_cast<std::size_t>(CPU_COUNT(&set));
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t threads = cores_in_mask(), mb = 1024, nta_after_mb = 0, flush_after_mb = 0;
  bool huge = false;
  int repeat = 5;
  Prefetch prefetch;
  std::string prefetch_mode = "default (l1)";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--prefetch") {
      prefetch_mode = argv[i + 1];
      if (!parse_prefetch(prefetch_mode, prefetch)) {
        std::fprintf(stderr, "stream_read_bench: --prefetch takes l1, off, l2:KB or both:KB\n");
        return 1;
      }
      continue;
    }
    if (a == "--huge") {
      huge = std::atol(argv[i + 1]) != 0;
      continue;
    }
    const long v = std::atol(argv[i + 1]);
    if (v <= 0) {
      std::fprintf(stderr, "stream_read_bench: %s needs a positive number\n", a.c_str());
      return 1;
    }
    if (a == "--threads") threads = static_cast<std::size_t>(v);
    else if (a == "--mb") mb = static_cast<std::size_t>(v);
    else if (a == "--repeat") repeat = static_cast<int>(v);
    else if (a == "--nta-after") nta_after_mb = static_cast<std::size_t>(v);
    else if (a == "--flush-after") flush_after_mb = static_cast<std::size_t>(v);
    else {
      std::fprintf(stderr, "usage: stream_read_bench [--threads N] [--mb SIZE] [--repeat R] [--prefetch MODE] [--nta-after MB] [--flush-after MB] [--huge 1]\n");
      return 1;
    }
  }
  const std::size_t n = mb * (1u << 20) / sizeof(float);
  const std::size_t nta_from =
      nta_after_mb ? nta_after_mb * (1u << 20) / sizeof(float) / threads : static_cast<std::size_t>(-1);
  const std::size_t flush_from =
      flush_after_mb ? flush_after_mb * (1u << 20) / sizeof(float) / threads : static_cast<std::size_t>(-1);
  // The buffer: its own mapping, on a 2 MB boundary (madvised with --huge).
  constexpr std::size_t huge_page = std::size_t{2} << 20;
  const std::size_t bytes = (n * sizeof(float) + 4095) / 4096 * 4096;
  void* raw = mmap(nullptr, bytes + huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    std::fprintf(stderr, "stream_read_bench: cannot map %zu MB\n", mb);
    return 1;
  }
  auto* buf_data = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(raw) + huge_page - 1) & ~(huge_page - 1));
  if (huge) madvise(buf_data, bytes, MADV_HUGEPAGE);
  struct View {
    float* p;
    float* data() const { return p; }
  } buf{buf_data};
  for (std::size_t i = 0; i < n; ++i) buf_data[i] = static_cast<float>(i & 1023) * 1e-3f;
  std::size_t huge_kb = 0;
  {
    std::ifstream smaps("/proc/self/smaps_rollup");
    for (std::string line; std::getline(smaps, line);)
      if (line.rfind("AnonHugePages:", 0) == 0) huge_kb = std::strtoul(line.c_str() + 14, nullptr, 10);
  }

  std::vector<float> sums(threads);
  std::barrier start(static_cast<std::ptrdiff_t>(threads) + 1), end(static_cast<std::ptrdiff_t>(threads) + 1);
  std::atomic<bool> quit{false};
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const std::size_t b = n * t / threads, e = n * (t + 1) / threads;
      for (;;) {
        start.arrive_and_wait();
        if (quit) return;
        sums[t] += sum_slice(buf.data() + b, e - b, prefetch, nta_from, flush_from);
        end.arrive_and_wait();
      }
    });
  std::vector<double> passes;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    start.arrive_and_wait();
    end.arrive_and_wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    passes.push_back(static_cast<double>(n * sizeof(float)) / s / 1e9);
  }
  std::sort(passes.begin(), passes.end());
  const double best = passes.back(), median = passes[passes.size() / 2];
  quit = true;
  start.arrive_and_wait();
  for (auto& t : pool) t.join();
  float check = 0.0f;
  for (float s : sums) check += s;
  std::printf("stream read: %zu threads, %zu MB, prefetch %s, nta after %zu MB, flush after %zu MB, "
              "huge pages: %zu MB, best of %d: %.1f GB/s, median %.1f (checksum %g)\n",
              threads, mb, prefetch_mode.c_str(), nta_after_mb ? nta_after_mb : mb,
              flush_after_mb ? flush_after_mb : mb, huge_kb / 1024, repeat, best, median,
              static_cast<double>(check));
  return 0;
}
