// The AMX prefill GEMM's tiles emulated in scalar code (tests check the loops of cpu_amx.inc on
// any CPU), the bf16 rounding of A, and whether this process can use AMX at all.
#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_amx.hpp"

#ifdef XSERV_HAVE_AMX  // cpu_amx.cpp is built (lib/backend/cpu/CMakeLists.txt)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace xserv::cpu {
namespace {

float bf16_value(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Eight 1 KB tiles of this thread, as the registers would hold them.
thread_local unsigned char emulated_tiles[8][1024];

struct Tiles {
  static void begin() {}
  static void end() {}
  static void zero_c() { std::memset(emulated_tiles, 0, 4 * 1024); }
  static void load(int t, const void* p, std::int64_t stride) {
    for (int r = 0; r < 16; ++r)
      std::memcpy(emulated_tiles[t] + r * 64, static_cast<const char*>(p) + r * stride, 64);
  }
  // TDPBF16PS: c[m][n] += sum over pairs k of a[m][2k] b[k][2n] + a[m][2k + 1] b[k][2n + 1].
  static void dp(int ct, int at, int bt) {
    float c[256];
    std::uint16_t a[512], b[512];
    std::memcpy(c, emulated_tiles[ct], 1024);
    std::memcpy(a, emulated_tiles[at], 1024);
    std::memcpy(b, emulated_tiles[bt], 1024);
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {
        float s = c[m * 16 + n];
        for (int k = 0; k < 16; ++k)
          s += bf16_value(a[m * 32 + 2 * k]) * bf16_value(b[k * 32 + 2 * n]) +
               bf16_value(a[m * 32 + 2 * k + 1]) * bf16_value(b[k * 32 + 2 * n + 1]);
        c[m * 16 + n] = s;
      }
    std::memcpy(emulated_tiles[ct], c, 1024);
  }
  static void step(const std::uint16_t* a0, const std::uint16_t* a1, std::int64_t lda_bytes,
                   const std::uint32_t* b0, const std::uint32_t* b1) {
    load(4, a0, lda_bytes);
    load(5, a1, lda_bytes);
    load(6, b0, 64);
    load(7, b1, 64);
    dp(0, 4, 6);
    dp(1, 4, 7);
    dp(2, 5, 6);
    dp(3, 5, 7);
  }
  static void load_c(const float* c, std::int64_t ldc) {
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 16; ++r)
        std::memcpy(emulated_tiles[t] + r * 64, c + ((t / 2) * 16 + r) * ldc + (t % 2) * 16, 64);
  }
  static void store_c(float* c, std::int64_t ldc) {
    for (int t = 0; t < 4; ++t)
      for (int r = 0; r < 16; ++r)
        std::memcpy(c + ((t / 2) * 16 + r) * ldc + (t % 2) * 16, emulated_tiles[t] + r * 64, 64);
  }
  static void pack(const std::uint16_t* const* src, std::int64_t kv, std::uint32_t* dst) {
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        std::uint32_t pair = 0;
        for (int h = 0; h < 2; ++h)
          if (src[c] && 2 * r + h < kv)
            pair |= static_cast<std::uint32_t>(src[c][2 * r + h]) << (16 * h);
        dst[r * 16 + c] = pair;
      }
  }
};

#include "backend/cpu/cpu_amx.inc"

}  // namespace

void amx_gemm_columns_emulated(const GemmProblem& p, std::int64_t n0, std::int64_t n1,
                               void* scratch) {
  columns(p, n0, n1, scratch);
}

void amx_round_rows(const float* a, std::int64_t m, std::int64_t k, std::uint16_t* a_bf16,
                    std::int64_t lda, std::int64_t r0, std::int64_t r1) noexcept {
  for (std::int64_t r = r0; r < r1; ++r) {
    std::uint16_t* o = a_bf16 + r * lda;
    std::int64_t i = 0;
    if (r < m)
      for (; i < k; ++i) {  // round to nearest even; NaN stays NaN (quiet)
        std::uint32_t u;
        std::memcpy(&u, a + r * k + i, 4);
        o[i] = (u & 0x7fffffffu) > 0x7f800000u
                   ? static_cast<std::uint16_t>((u >> 16) | 0x40u)
                   : static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      }
    for (; i < lda; ++i) o[i] = 0;
  }
}

bool amx_bf16_usable() noexcept {
#ifdef XSERV_HAVE_AMX
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    // Linux hands out the 8 KB tile state only on request (ARCH_REQ_XCOMP_PERM, feature 18,
    // XTILEDATA); without it the first tile instruction faults.
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return usable;
#else
  return false;
#endif
}

#ifndef XSERV_HAVE_AMX
void amx_gemm_columns(const GemmProblem&, std::int64_t, std::int64_t, void*) {}  // never called
#endif

}  // namespace xserv::cpu
