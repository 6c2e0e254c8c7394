// The AMX prefill GEMM on the tile instructions (cpu_amx.hpp). Compiled with AMX-TILE, AMX-BF16
// and AVX-512 flags; called only where amx_bf16_usable() (cpu_amx_emulated.cpp).
#include "backend/cpu/cpu_amx.hpp"

#include <immintrin.h>

#include <cstdint>

namespace xserv::cpu {
namespace {

struct Tiles {
  static void begin() {
    // palette 1; tiles 0-7 all 16 rows of 64 bytes (colsb at byte 16 + 2t, rows at 48 + t).
    alignas(64) unsigned char cfg[64] = {};
    cfg[0] = 1;
    for (int t = 0; t < 8; ++t) {
      cfg[16 + 2 * t] = 64;
      cfg[48 + t] = 16;
    }
    _tile_loadconfig(cfg);
  }
  static void end() { _tile_release(); }
  static void zero_c() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  static void step(const std::uint16_t* a0, const std::uint16_t* a1, std::int64_t lda_bytes,
                   const std::uint32_t* b0, const std::uint32_t* b1) {
    _tile_loadd(4, a0, lda_bytes);
    _tile_loadd(5, a1, lda_bytes);
    _tile_loadd(6, b0, 64);
    _tile_loadd(7, b1, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  static void load_c(const float* c, std::int64_t ldc) {
    _tile_loadd(0, c, ldc * 4);
    _tile_loadd(1, c + 16, ldc * 4);
    _tile_loadd(2, c + 16 * ldc, ldc * 4);
    _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  }
  static void store_c(float* c, std::int64_t ldc) {
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
  }
  // 16 rows of 16 pairs (32-bit lanes) transposed in registers: unpack pairs of rows, pairs of
  // pairs, then a 4 x 4 transpose of 128-bit lanes (cpu_kernels.inc's transpose_block).
  static void pack(const std::uint16_t* const* src, std::int64_t kv, std::uint32_t* dst) {
    constexpr __mmask16 all16 = 0xffff;
    constexpr __mmask8 all8 = 0xff;
    const __mmask32 valid = kv >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << kv) - 1u);
    __m512 r[16];
    for (int c = 0; c < 16; ++c)
      r[c] = src[c] ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(valid, src[c]))
                    : _mm512_setzero_ps();
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_maskz_unpacklo_ps(all16, r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all16, r[2 * i], r[2 * i + 1]);
    }
    __m512 s[16];
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]),
                    c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
      s[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, a, c));
      s[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, a, c));
      s[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(all8, b, d));
      s[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(all8, b, d));
    }
    float* out = reinterpret_cast<float*>(dst);  // 64-byte aligned: whole 1 KB tiles of the scratch
    for (int j = 0; j < 4; ++j) {
      const __m512 a = _mm512_maskz_shuffle_f32x4(all16, s[j], s[4 + j], 0x44),
                   b = _mm512_maskz_shuffle_f32x4(all16, s[j], s[4 + j], 0xee),
                   c = _mm512_maskz_shuffle_f32x4(all16, s[8 + j], s[12 + j], 0x44),
                   d = _mm512_maskz_shuffle_f32x4(all16, s[8 + j], s[12 + j], 0xee);
      _mm512_store_ps(out + 16 * j, _mm512_maskz_shuffle_f32x4(all16, a, c, 0x88));
      _mm512_store_ps(out + 16 * (4 + j), _mm512_maskz_shuffle_f32x4(all16, a, c, 0xdd));
      _mm512_store_ps(out + 16 * (8 + j), _mm512_maskz_shuffle_f32x4(all16, b, d, 0x88));
      _mm512_store_ps(out + 16 * (12 + j), _mm512_maskz_shuffle_f32x4(all16, b, d, 0xdd));
    }
  }
};

#include "backend/cpu/cpu_amx.inc"

}  // namespace

void amx_gemm_columns(const GemmProblem& p, std::int64_t n0, std::int64_t n1, void* scratch) {
  columns(p, n0, n1, scratch);
}

}  // namespace xserv::cpu
