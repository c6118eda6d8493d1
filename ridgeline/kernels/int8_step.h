/* One k step of the int8 weight-only kernels (gemm_int8.c, gemm_int8_g32.c), shared: with
 * AVX512-BF16 x is rounded to bf16 rows first (x_rows_to_bf16, their prep) and a step is a k pair,
 * whose 32 weights per vector become bf16 pairs in registers (exact: |q| <= 127) for vdpbf16ps;
 * without it a step is one k, its 16 weights per vector widened to fp32 for FMAs on fp32 x. The weights come in
 * the layout ridgeline_pack_i8_gemm writes: [K/2][NC][2] pairs, or [K][NC]. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_tile.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define I8_BF16 1
#define I8_STEP 2      /* k per step: a pair */
typedef uint16_t i8_x; /* x as the kernels read it: bf16 */
#else
#define I8_BF16 0
#define I8_STEP 1
typedef float i8_x;
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* rows of x [M, K] -> xb [M, K2] bf16, K2 >= K even, the pad k zero */
static inline void x_rows_to_bf16(const float *x, uint16_t *xb, int64_t M, int64_t K, int64_t K2) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K2; k += 32) {
            const __mmask16 ma = qt_mask(k, K), mb = qt_mask(k + 16, K);
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(mb, x + m * K + k + 16),
                                                   _mm512_maskz_loadu_ps(ma, x + m * K + k));
            const __mmask32 keep = K2 - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (K2 - k)) - 1);
            _mm512_mask_storeu_epi16(xb + m * K2 + k, keep, (__m512i)v);
        }
}

/* a k pair's 32 int8 weights of 16 columns (src: [16][2]) -> 16 bf16 pairs, exact (|q| <= 127) */
static inline __attribute__((always_inline)) __m512bh i8_pairs_to_bf16(const int8_t *src) {
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(src + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo); /* lanes 0-7 from lo's pairs, 8-15 from hi's */
}
#endif

/* what the int8 kernels' driver callbacks (tile_driver.h) read */
typedef struct {
    const int8_t *p;
    const void *s;  /* scales: fp32 per channel (gemm_int8.c), fp16 per 32 k (gemm_int8_g32.c) */
    const float *x; /* fp32 rows of K */
    float *y;
    int64_t N, K, K2; /* K2: the packed k (K rounded up to even with bf16), the row length of x as read */
} i8_args;

/* bytes of x as the kernels read it, [M][K2]: the prepared copy with bf16, 0 (x is read as it is) without */
static inline size_t i8_x_bytes(int64_t M, int64_t K2) {
#if I8_BF16
    return (size_t)(M * K2) * sizeof(uint16_t);
#else
    (void)M; (void)K2;
    return 0;
#endif
}

#if I8_BF16
/* the driver's prep: rows [r0, r1) of x rounded to bf16 into ws [M][K2] */
static void i8_prep(const void *args, void *ws, int64_t r0, int64_t r1) {
    const i8_args *a = args;
    x_rows_to_bf16(a->x + r0 * a->K, (uint16_t *)ws + r0 * a->K2, r1 - r0, a->K, a->K2);
}
#define I8_PREP i8_prep
#else
#define I8_PREP NULL
#endif

/* x as a tile reads it, from row m and k k0: the prepared copy (bf16), or x itself */
static inline const i8_x *i8_x_at(const i8_args *a, const void *ws, int64_t m, int64_t k0) {
    return (ws ? (const i8_x *)ws : (const i8_x *)a->x) + m * a->K2 + k0;
}

#ifdef __AVX512F__
/* step k0 (and k0 + 1 with bf16) of mr rows of x (stride ldx) against ng (1 or 2) column groups pw
 * (group stride gs bytes): acc[i * ld + v] += the products, in k order */
static inline __attribute__((always_inline)) void
i8_step(const int mr, const int ng, const int8_t *pw, int64_t gs, const i8_x *x, int64_t ldx, int64_t k0, __m512 *acc,
        const int ld) {
    const int nv = ng * QT_NR;
#if I8_BF16
    __m512bh wv[2 * QT_NR];
    for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + k0 * QT_NC, 2, mr); /* 96 bytes per pair */
    for (int v = 0; v < nv; v++) wv[v] = i8_pairs_to_bf16(pw + (v / QT_NR) * gs + (k0 * QT_NC + 32 * (v % QT_NR)));
    for (int i = 0; i < mr; i++) {
        int32_t pair;
        memcpy(&pair, x + i * ldx + k0, 4);
        const __m512bh xp = (__m512bh)_mm512_set1_epi32(pair);
        for (int v = 0; v < nv; v++) acc[i * ld + v] = _mm512_dpbf16_ps(acc[i * ld + v], xp, wv[v]);
    }
#else
    __m512 wv[2 * QT_NR];
    for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + k0 * QT_NC, 1, mr); /* 48 bytes per k */
    for (int v = 0; v < nv; v++) {
        const int8_t *src = pw + (v / QT_NR) * gs + k0 * QT_NC + 16 * (v % QT_NR);
        wv[v] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src)));
    }
    for (int i = 0; i < mr; i++) {
        const __m512 xb = _mm512_set1_ps(x[i * ldx + k0]);
        for (int v = 0; v < nv; v++) acc[i * ld + v] = _mm512_fmadd_ps(xb, wv[v], acc[i * ld + v]);
    }
#endif
}
#endif
