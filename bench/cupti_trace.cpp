// cupti_trace: a GPU timeline of any CUDA program, for machines without Nsight Systems (the GPU
// machine has ncu but no nsys). Loaded by the CUDA driver as an injection library:
//
//   CUDA_INJECTION64_PATH=/tmp/b/bench/libxserv_cupti_trace.so XSERV_TRACE_OUT=trace.csv serve_bench ...
//
// It records, through CUPTI's activity API, every kernel (graph replays included: one record a
// node), memcpy and memset with device timestamps, and every CUDA runtime call with host
// timestamps, and writes them at exit as CSV, sorted by start:
//   kind,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,graph_id,bytes,name
// kind is kernel, memcpy, memset or api; grid and block are kernels' launch shape (the
// embedding kernel's grid_x is the step's token count); names are demangled.
// scripts/cupti_steps.py turns a trace into a table of steps (serving runs) and a decode step's
// anatomy. The timestamps cost each kernel ~1 us or less of host time, none on the device.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  std::uint64_t start, end;
  std::uint32_t stream;
  std::int32_t grid[3], block_x;
  std::uint32_t graph;
  std::uint64_t bytes;
  const char* kind;
  std::string name;
};

std::mutex g_mutex;
std::vector<Record> g_records;
constexpr std::size_t buffer_bytes = 8u << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "cupti_trace: %s: %s\n", what, msg ? msg : "?");
}

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : name;
  std::free(d);
  return s;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size, std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, buffer_bytes));
  *size = buffer_bytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  std::vector<Record> got;
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    Record r{};
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        r = Record{k->start, k->end, k->streamId, {k->gridX, k->gridY, k->gridZ}, k->blockX,
                   k->graphId, 0, "kernel", demangle(k->name)};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        static const char* kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD",
                                      "DtoA", "DtoD", "HtoH", "PtoP"};
        r = Record{m->start, m->end, m->streamId, {0, 0, 0}, 0, m->graphId, m->bytes, "memcpy",
                   std::string("[CUDA memcpy ") + (m->copyKind < 11 ? kinds[m->copyKind] : "?") + "]"};
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        r = Record{m->start, m->end, m->streamId, {0, 0, 0}, 0, m->graphId, m->bytes, "memset",
                   "[CUDA memset]"};
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const char* n = nullptr;
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &n);
        r = Record{a->start, a->end, a->threadId, {0, 0, 0}, 0, 0, 0, "api", n ? n : "?"};
        break;
      }
      default: continue;
    }
    got.push_back(std::move(r));
  }
  std::size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped > 0) std::fprintf(stderr, "cupti_trace: %zu records dropped\n", dropped);
  std::free(buffer);
  std::lock_guard lock(g_mutex);
  for (auto& r : got) g_records.push_back(std::move(r));
}

void write_out() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  const char* path = std::getenv("XSERV_TRACE_OUT");
  std::FILE* f = std::fopen(path ? path : "cupti_trace.csv", "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cupti_trace: cannot write %s\n", path ? path : "cupti_trace.csv");
    return;
  }
  std::lock_guard lock(g_mutex);
  std::stable_sort(g_records.begin(), g_records.end(),
                   [](const Record& a, const Record& b) { return a.start < b.start; });
  std::fprintf(f, "kind,start_ns,end_ns,stream,grid_x,grid_y,grid_z,block_x,graph_id,bytes,name\n");
  for (const Record& r : g_records) {
    std::string name = r.name;
    std::replace(name.begin(), name.end(), '"', '\'');
    std::fprintf(f, "%s,%llu,%llu,%u,%d,%d,%d,%d,%u,%llu,\"%s\"\n", r.kind,
                 static_cast<unsigned long long>(r.start), static_cast<unsigned long long>(r.end),
                 r.stream, r.grid[0], r.grid[1], r.grid[2], r.block_x, r.graph,
                 static_cast<unsigned long long>(r.bytes), name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "cupti_trace: %zu records to %s\n", g_records.size(),
               path ? path : "cupti_trace.csv");
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "memset");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "runtime");
  std::atexit(write_out);
  return 1;
}
