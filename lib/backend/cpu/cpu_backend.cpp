// CpuBackend: memory, batch upload and the elementwise ops (embedding, gelu, swiglu, gather).
// GEMM, norms, attention and sampling live in cpu_gemm.cpp, cpu_norm.cpp, cpu_attention.cpp and
// cpu_sampling.cpp.
#include "backend/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_amx.hpp"
#include "backend/cpu/tensor_checks.hpp"

#ifdef XSERV_HAVE_BLAS
#include <cblas.h>
// OpenBLAS's own thread count; declared here too in case cblas.h is another vendor's.
extern "C" void openblas_set_num_threads(int num_threads);
#endif

namespace xserv::cpu {

namespace {

std::uint32_t env_us(const char* name, std::uint32_t fallback) {
  const char* v = std::getenv(name);
  return v ? static_cast<std::uint32_t>(std::strtoul(v, nullptr, 10)) : fallback;
}

// The pool's hand-off settings: it starts idle (XSERV_CPU_IDLE_SPIN_US, below); XSERV_CPU_CHUNKS
// overrides the chunks per thread (for measuring on a given machine; see ThreadPool::Options and
// docs/cpu.md).
ThreadPool::Options pool_options() {
  ThreadPool::Options o;
  o.spin_us = env_us("XSERV_CPU_IDLE_SPIN_US", 20);
  if (const char* v = std::getenv("XSERV_CPU_CHUNKS"))
    o.chunks_per_thread = static_cast<std::uint32_t>(std::strtoul(v, nullptr, 10));
  return o;
}

// How long idle threads poll for the next loop (docs/cpu.md), by phase:
// - while a forward runs, 200 us (XSERV_CPU_SPIN_US for decode batches, XSERV_CPU_PREFILL_SPIN_US
//   for larger ones, by default the larger of 200 and the decode value). A forward's loops come
//   back to back (a decode layer is ~10 ops, a prefill's GEMMs end up to a task apart): with
//   20 us, workers went to sleep between them and every next loop paid for waking them. On the
//   GPU machine's Xeon, 200 us gave GPT-2 124M +5.6% prefill at 8 threads (medians of 3,
//   docs/benchmarks.md), and in decode Qwen3-0.6B 50.8 -> 53.9 tok/s and GPT-2 121.4 -> 129.9
//   at 8 threads (XSERV_CPU_SPIN_US=20 vs the default, medians of 3, 2026-12-02).
// - after the step's sample, until the next forward: 20 us (XSERV_CPU_IDLE_SPIN_US), so the
//   workers of a host that does something else between steps (a game's frame) sleep instead of
//   burning its cores. XSERV_CPU_SPIN_US=20 gives the old rule (20 us in decode throughout).
std::uint32_t decode_spin_us() { return env_us("XSERV_CPU_SPIN_US", 200); }
std::uint32_t prefill_spin_us(std::uint32_t decode_spin_us) {
  return env_us("XSERV_CPU_PREFILL_SPIN_US", std::max<std::uint32_t>(decode_spin_us, 200));
}

}  // namespace

std::int64_t min_parallel_bytes() {
  static const std::int64_t bytes = [] {
    const char* v = std::getenv("XSERV_CPU_PARALLEL_KB");
    return v ? 1024 * std::max<std::int64_t>(1, std::atoll(v)) : std::int64_t{128} * 1024;
  }();
  return bytes;
}

namespace {

// XSERV_CPU_KV: "bf16" keeps the K/V cache of bf16 models in bf16 (CpuBackend::kv_dtype);
// unset or "f32", f32. Read by every backend constructed (tests set it per backend).
bool kv_bf16_mode() {
  const char* v = std::getenv("XSERV_CPU_KV");
  if (v == nullptr || std::string_view(v) == "f32") return false;
  XSERV_CHECK(std::string_view(v) == "bf16", ErrorCode::invalid_argument,
              "XSERV_CPU_KV must be f32 or bf16, not '{}'", v);
  return true;
}

// XSERV_CPU_AMX: unset or 1, the AMX bf16 prefill GEMM where amx_bf16_usable(); 0, never;
// "emulate", its loops with the tiles emulated in scalar code on any CPU (slow: tests only).
// Read by every backend constructed (tests set it per backend).
int amx_mode() {
  const char* v = std::getenv("XSERV_CPU_AMX");
  const std::string_view s(v ? v : "1");
  if (s == "emulate") return 2;
  return s == "0" || !amx_bf16_usable() ? 0 : 1;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options, const KernelTable* kernels, bool use_blas)
    : pool_(options.threads, pool_options()),
      kernels_(kernels ? kernels : &cpu::kernels()),
      // Measured (bench/cpu_ops_bench, f32 GPT-2 shapes, M = 128/512): the AVX-512 kernel runs
      // at about twice Debian OpenBLAS 0.3.21's sgemm on an AVX-512 EPYC; the AVX2 kernel is on
      // par with it and the generic one slower, so OpenBLAS keeps f32 prefill there.
      use_blas_(use_blas && std::string_view(kernels_->isa) != "avx512"),
      amx_(amx_mode()),
      kv_bf16_(kv_bf16_mode()),
      decode_spin_us_(decode_spin_us()),
      prefill_spin_us_(prefill_spin_us(decode_spin_us_)),
      idle_spin_us_(pool_.spin_us()) {
#ifdef XSERV_HAVE_BLAS
  // OpenBLAS keeps a process-wide pool; match it to ours so the two never oversubscribe.
  if (use_blas_) openblas_set_num_threads(static_cast<int>(pool_.size()));
#endif
}

std::string CpuBackend::name() const {
#ifdef XSERV_HAVE_BLAS
  const bool blas = use_blas_;
#else
  const bool blas = false && use_blas_;
#endif
  return fmt::format("cpu ({} threads, {} kernels{}{})", pool_.size(), kernels_->isa,
                     blas ? ", OpenBLAS sgemm" : "",
                     amx_ == 1   ? ", AMX bf16 prefill"
                     : amx_ == 2 ? ", AMX bf16 prefill emulated"
                                 : "");
}

namespace {

// XSERV_CPU_HUGEPAGES (read once): unset or 0, the default, plain 64-byte aligned memory
// (cpu_allocator); 1 asks for transparent huge pages on large host allocations (HugePageAllocator
// below). Opt-in: on the GPU machine's Xeon (2026-12-03) it did not win (Qwen3-0.6B decode at 8
// threads -9%, the 16-thread streaming read slower; docs/benchmarks.md, issue 16).
bool hugepages_wanted() {
  static const bool on = [] {
    const char* v = std::getenv("XSERV_CPU_HUGEPAGES");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

// Host memory for the CPU backend's weights copies (dummy weights, GPT-2's transposed Conv1D
// weights), KV cache and workspace. Allocations of at least 2 MB are their own anonymous mapping
// starting on a 2 MB boundary, with madvise(MADV_HUGEPAGE): where transparent huge pages are
// `madvise` (the GPU machine's Xeon, this dev machine) each whole 2 MB of it is one TLB entry
// instead of 512. A decode reads every weight once per token, so with 4 KB pages it walked the
// page tables every 4 KB of the stream (~120k walks a token for GPT-2 124M f32; in a VM each
// walk is two-dimensional). The mapping is sized to the allocation rounded to 4 KB (the tail
// past the last 2 MB boundary stays 4 KB pages), so no memory is added. Smaller allocations go
// to cpu_allocator. Mapped pages are zero; nothing relies on that.
class HugePageAllocator final : public Allocator {
 public:
  static constexpr std::size_t huge = std::size_t{2} << 20;
  Device device() const noexcept override { return {DeviceKind::cpu, 0}; }
  void* allocate(std::size_t bytes) override {
    if (bytes < huge) return cpu_allocator().allocate(bytes);
    const std::size_t size = mapped_size(bytes);
    // Map 2 MB more, then unmap the head before the first 2 MB boundary and the tail after.
    void* raw = mmap(nullptr, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
      throw_error(ErrorCode::out_of_memory, "cannot map {} bytes of host memory", bytes);
    const auto at = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t start = (at + huge - 1) & ~(std::uintptr_t{huge} - 1);
    if (start > at) munmap(raw, start - at);
    const std::size_t tail = (at + size + huge) - (start + size);
    if (tail) munmap(reinterpret_cast<void*>(start + size), tail);
    void* p = reinterpret_cast<void*>(start);
    madvise(p, size, MADV_HUGEPAGE);  // advice: where THP is off it changes nothing
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (p == nullptr) return;
    if (bytes < huge) return cpu_allocator().deallocate(p, bytes);
    munmap(p, mapped_size(bytes));
  }

 private:
  static std::size_t mapped_size(std::size_t bytes) {
    const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096);
    return (bytes + page - 1) / page * page;
  }
};

}  // namespace

Allocator& hugepage_allocator() noexcept {
  static HugePageAllocator huge;
  return huge;
}

Allocator& CpuBackend::allocator() noexcept {
  return hugepages_wanted() ? hugepage_allocator() : cpu_allocator();
}

Tensor CpuBackend::import_weight(const Tensor& host) {
  XSERV_CHECK(host.device.kind == DeviceKind::cpu, ErrorCode::invalid_argument,
              "import_weight: the source of shape {} is not in host memory", host.shape);
  return host;  // zero copy: the mmap'd checkpoint is already where the CPU ops read
}

void CpuBackend::upload(Tensor dst, const void* host_src) {
  check_data("upload", "dst", dst);
  if (dst.bytes() && dst.data != host_src) std::memcpy(dst.data, host_src, dst.bytes());
}

void CpuBackend::download(void* host_dst, const Tensor& src) {
  check_data("download", "src", src);
  if (src.bytes() && src.data != host_dst) std::memcpy(host_dst, src.data, src.bytes());
}

void CpuBackend::fill_zero(Tensor dst) {
  check_data("fill_zero", "dst", dst);
  if (dst.bytes()) std::memset(dst.data, 0, dst.bytes());
}

void CpuBackend::copy(Tensor dst, const Tensor& src) {
  check_data("copy", "dst", dst);
  check_data("copy", "src", src);
  XSERV_CHECK(dst.bytes() == src.bytes(), ErrorCode::invalid_argument,
              "copy: {} bytes into {} bytes", src.bytes(), dst.bytes());
  if (dst.bytes() && dst.data != src.data) std::memmove(dst.data, src.data, dst.bytes());
}

namespace {
// dst[N, K] = src[K, N]ᵀ in 32 x 32 tiles: both sides touch whole cache lines while a tile stays
// in L1.
template <typename T>
void transpose_tiles(const T* src, T* dst, std::int64_t k, std::int64_t n) {
  constexpr std::int64_t tile = 32;
  for (std::int64_t k0 = 0; k0 < k; k0 += tile)
    for (std::int64_t n0 = 0; n0 < n; n0 += tile)
      for (std::int64_t i = k0; i < std::min(k, k0 + tile); ++i)
        for (std::int64_t j = n0; j < std::min(n, n0 + tile); ++j) dst[j * k + i] = src[i * n + j];
}
}  // namespace

void CpuBackend::transpose(Tensor dst, const Tensor& src) {
  check_data("transpose", "dst", dst);
  check_data("transpose", "src", src);
  XSERV_CHECK(src.shape.rank() == 2 && dst.shape == Shape({src.shape[1], src.shape[0]}) &&
                  dst.dtype == src.dtype && (dtype_size(src.dtype) == 2 || dtype_size(src.dtype) == 4),
              ErrorCode::invalid_argument, "transpose: {} {} into {} {}", dtype_name(src.dtype),
              src.shape, dtype_name(dst.dtype), dst.shape);
  const std::int64_t k = src.shape[0], n = src.shape[1];
  if (dtype_size(src.dtype) == 4)
    transpose_tiles(static_cast<const std::uint32_t*>(src.data), static_cast<std::uint32_t*>(dst.data), k, n);
  else
    transpose_tiles(static_cast<const std::uint16_t*>(src.data), static_cast<std::uint16_t*>(dst.data), k, n);
}

MemoryInfo CpuBackend::memory_info() const {
  const long page = sysconf(_SC_PAGESIZE);
  const long avail = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
  MemoryInfo m;
  if (page > 0 && avail > 0) m.free_bytes = static_cast<std::size_t>(avail) * static_cast<std::size_t>(page);
  if (page > 0 && total > 0) m.total_bytes = static_cast<std::size_t>(total) * static_cast<std::size_t>(page);
  return m;
}

DeviceBatch CpuBackend::upload_batch(const ForwardBatch& b) {
  pool_.set_spin_us(static_cast<std::int64_t>(b.token_ids.size()) > gemv_max_rows ? prefill_spin_us_
                                                                                  : decode_spin_us_);
  const std::vector<std::int32_t>* parts[] = {&b.token_ids,    &b.positions,    &b.slot_mapping,
                                              &b.query_start,  &b.context_lens, &b.block_tables,
                                              &b.logit_rows};
  std::size_t total = 0;
  for (const auto* p : parts) total += p->size();
  batch_storage_.resize(total);
  Tensor views[7];
  std::size_t at = 0;
  for (std::size_t i = 0; i < 7; ++i) {
    const auto& v = *parts[i];
    if (!v.empty()) std::memcpy(batch_storage_.data() + at, v.data(), v.size() * sizeof(std::int32_t));
    views[i] = Tensor(v.empty() ? nullptr : batch_storage_.data() + at, DType::i32,
                      Shape{static_cast<std::int64_t>(v.size())}, device());
    at += v.size();
  }
  DeviceBatch d;
  d.token_ids = views[0];
  d.positions = views[1];
  d.slot_mapping = views[2];
  d.query_start = views[3];
  d.context_lens = views[4];
  d.block_tables = views[5];
  d.logit_rows = views[6];
  d.num_tokens = b.num_tokens();
  d.num_seqs = b.num_seqs();
  d.num_logit_rows = static_cast<std::int32_t>(b.logit_rows.size());
  d.max_query_len = b.max_query_len();
  d.max_context_len = b.max_context_len();
  d.max_blocks_per_seq = b.max_blocks_per_seq;
  return d;
}

void CpuBackend::embedding(Tensor out, const Tensor& ids, const Tensor& table,
                           const Tensor& pos_table, const Tensor& positions) {
  constexpr const char* op = "embedding";
  check_dtype(op, "ids", ids, DType::i32);
  check_dtype(op, "out", out, DType::f32);
  check_float(op, "table", table);
  XSERV_CHECK(table.shape.rank() == 2, ErrorCode::invalid_argument,
              "embedding: table has shape {}, expected [vocab, d]", table.shape);
  const std::int64_t t_count = ids.numel(), d = table.shape[1], vocab = table.shape[0];
  check_shape(op, "out", out, Shape{t_count, d});
  check_data(op, "ids", ids);
  check_data(op, "out", out);
  const bool with_pos = !pos_table.empty();
  if (with_pos) {
    check_float(op, "pos_table", pos_table);
    check_dtype(op, "positions", positions, DType::i32);
    XSERV_CHECK(pos_table.shape.rank() == 2 && pos_table.shape[1] == d, ErrorCode::invalid_argument,
                "embedding: pos_table has shape {}, expected [positions, {}]", pos_table.shape, d);
    check_shape(op, "positions", positions, Shape{t_count});
    check_data(op, "positions", positions);
  }
  const auto* id = ids.as<const std::int32_t>();
  const auto* pos = with_pos ? positions.as<const std::int32_t>() : nullptr;
  for (std::int64_t t = 0; t < t_count; ++t) {
    XSERV_CHECK(id[t] >= 0 && id[t] < vocab, ErrorCode::invalid_argument,
                "embedding: token id {} at row {} is outside the vocabulary of {}", id[t], t, vocab);
    if (with_pos)
      XSERV_CHECK(pos[t] >= 0 && pos[t] < pos_table.shape[0], ErrorCode::invalid_argument,
                  "embedding: position {} at row {} is outside the {} learned positions", pos[t],
                  t, pos_table.shape[0]);
  }
  const std::size_t esize = dtype_size(table.dtype), psize = dtype_size(pos_table.dtype);
  pool_.parallel_for(static_cast<std::size_t>(t_count), [&](std::size_t b, std::size_t e) {
    std::vector<float> tmp(with_pos ? static_cast<std::size_t>(d) : 0);
    for (std::size_t t = b; t < e; ++t) {
      float* o = out.as<float>() + static_cast<std::int64_t>(t) * d;
      convert_to_f32(table.as<const char>() + static_cast<std::size_t>(id[t]) * d * esize,
                     table.dtype, o, static_cast<std::size_t>(d));
      if (with_pos) {
        convert_to_f32(pos_table.as<const char>() + static_cast<std::size_t>(pos[t]) * d * psize,
                       pos_table.dtype, tmp.data(), tmp.size());
        for (std::int64_t i = 0; i < d; ++i) o[i] += tmp[static_cast<std::size_t>(i)];
      }
    }
  }, 8);
}

void CpuBackend::gelu(Tensor x) {
  check_dtype("gelu", "x", x, DType::f32);
  check_data("gelu", "x", x);
  float* p = x.as<float>();
  const KernelTable& kt = *kernels_;
  pool_.parallel_for(static_cast<std::size_t>(x.numel()), [&](std::size_t b, std::size_t e) {
    kt.gelu(p + b, static_cast<std::int64_t>(e - b));
  }, 4096);
}

void CpuBackend::swiglu(Tensor out, const Tensor& gate_up) {
  constexpr const char* op = "swiglu";
  check_dtype(op, "gate_up", gate_up, DType::f32);
  check_dtype(op, "out", out, DType::f32);
  const std::int64_t rows = rows_of(gate_up), width = gate_up.shape.back();
  XSERV_CHECK(gate_up.shape.rank() == 2 && width % 2 == 0, ErrorCode::invalid_argument,
              "swiglu: gate_up has shape {}, expected [T, 2 * I]", gate_up.shape);
  const std::int64_t inter = width / 2;
  check_shape(op, "out", out, Shape{rows, inter});
  check_data(op, "gate_up", gate_up);
  check_data(op, "out", out);
  const KernelTable& kt = *kernels_;
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) {
      const float* g = gate_up.as<const float>() + static_cast<std::int64_t>(r) * width;
      kt.silu_mul(out.as<float>() + static_cast<std::int64_t>(r) * inter, g, g + inter, inter);
    }
  }, 1);
}

void CpuBackend::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  constexpr const char* op = "gather_rows";
  check_dtype(op, "rows", rows, DType::i32);
  check_dtype(op, "x", x, DType::f32);
  check_dtype(op, "out", out, DType::f32);
  XSERV_CHECK(x.shape.rank() == 2, ErrorCode::invalid_argument,
              "gather_rows: x has shape {}, expected [T, d]", x.shape);
  const std::int64_t r_count = rows.numel(), d = x.shape[1];
  check_shape(op, "out", out, Shape{r_count, d});
  check_data(op, "rows", rows);
  const auto* r = rows.as<const std::int32_t>();
  for (std::int64_t i = 0; i < r_count; ++i) {
    XSERV_CHECK(r[i] >= 0 && r[i] < x.shape[0], ErrorCode::invalid_argument,
                "gather_rows: row {} is outside x of shape {}", r[i], x.shape);
    std::memmove(out.as<float>() + i * d, x.as<const float>() + r[i] * d,
                 static_cast<std::size_t>(d) * sizeof(float));
  }
}

}  // namespace xserv::cpu
