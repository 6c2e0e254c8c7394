// The kernels at the compiler's baseline ISA, and the run-time choice between the compiled copies.
#define XSERV_CPU_NS generic
#define XSERV_CPU_VL 4
#define XSERV_CPU_NAME "generic"
#include "backend/cpu/cpu_kernels.inc"

#include <cstdlib>
#include <string_view>

namespace xserv::cpu {

std::vector<const KernelTable*> supported_kernels() {
  std::vector<const KernelTable*> v{&generic::table};
#ifdef XSERV_CPU_X86_KERNELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    v.push_back(&avx2::table);
    // F + BW + DQ + VL: every AVX-512 CPU since Skylake-SP (BW gives the 16-bit widening
    // vpmovzxwd zmm that bf16/f16 weights need; without it GCC splits it into halves).
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      v.push_back(&avx512::table);
  }
#endif
  return v;
}

const KernelTable& kernels() noexcept {
  static const KernelTable* const chosen = [] {
    auto all = supported_kernels();
    const char* want = std::getenv("XSERV_CPU_ISA");
    if (want)
      for (const auto* t : all)
        if (std::string_view(t->isa) == want) return t;
    return all.back();
  }();
  return *chosen;
}

}  // namespace xserv::cpu
