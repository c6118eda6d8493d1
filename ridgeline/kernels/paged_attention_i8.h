/* int8 K and V read in place by decode attention (paged_attention.c includes it after the AVX-512
 * instantiations, whose helpers it uses): K codes widened to int16 and dotted with q rounded to int16
 * (vpdpwssd, exact int32 sums), each score scaled once by its key's fp16 scale, q's scale and scale_qk;
 * V as in attend_tile_i8v_fast. Defines HAVE_I8_FAST where the CPU has AVX512-VNNI. */
#pragma once
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* q row [D] -> D / 32 vectors of int16 codes round(q * 2^e) (nearest even, saturated), e the largest with
 * max|q| * 2^e < 2^15; returns 2^-e. The scale is a power of two, so the rounding is the only error:
 * at most 2^-15 of max|q| per element (int8 K's own rounding: up to 2^-8 of max|k|). */
static inline float q16_prep(__m512i *dst, const float *q, int64_t D) {
    __m512 vmax = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(q + d)));
    int x;
    frexpf(_mm512_reduce_max_ps(vmax), &x); /* max|q| < 2^x (x = 0 for 0) */
    const int e = 15 - x < -100 ? -100 : 15 - x > 100 ? 100 : 15 - x;
    const __m512 m = _mm512_set1_ps(ldexpf(1.f, e));
#define Q16(p) _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(m, _mm512_loadu_ps(p))))
    for (int64_t k = 0; k < D / 32; k++)
        dst[k] = _mm512_inserti64x4(_mm512_castsi256_si512(Q16(q + 32 * k)), Q16(q + 32 * k + 16), 1);
#undef Q16
    return ldexpf(1.f, -e);
}
/* int8 K and V read in place: K codes widened to int16 and dotted with the int16 q (vpdpwssd), 32 at a
 * time; V as in attend_tile_i8v_fast */
#define FAST attend_i8_fast
#define KV_T int8_t
#define QK_W 32
#define QV_T __m512i
#define QK_INT16 1
#define QK_STEP(acc, qv, kp) \
    _mm512_dpwssd_epi32(acc, qv, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(kp))))
#define V_SCALED 1
#define K_WIDE_T int16_t
#define K_WIDEN(dst, kp) \
    _mm512_store_si512((void *)(dst), _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(kp))))
#define K_WIDE_STEP(acc, qv, wp) _mm512_dpwssd_epi32(acc, qv, _mm512_load_si512((const void *)(wp)))
#define V_LOAD(p, e) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((p) + 16 * (e)))))
#include "paged_attention_avx512.h"
#undef FAST
#undef KV_T
#undef QK_W
#undef QV_T
#undef QK_INT16
#undef QK_STEP
#undef V_SCALED
#undef K_WIDE_T
#undef K_WIDEN
#undef K_WIDE_STEP
#undef V_LOAD
#define HAVE_I8_FAST 1
#endif
