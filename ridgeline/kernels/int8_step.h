/* One k step of the int8 weight-only kernels (gemm_int8.c, gemm_int8_g32.c), shared: with
 * AVX512-BF16 x is rounded to bf16 rows first (x_rows_to_bf16) and a step is a k pair, whose 32
 * weights per vector become bf16 pairs in registers (exact: |q| <= 127) for vdpbf16ps; without it a
 * step is one k, its 16 weights per vector widened to fp32 for FMAs on fp32 x. The weights come in
 * the layout ridgeline_pack_i8_gemm writes: [K/2][NC][2] pairs, or [K][NC]. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "omp_range.h"
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

#define I8_OWN_ROWS 8 /* up to this many rows each thread converts all of x itself (bf16) */

/* x as the kernels read it, [M][K2] (K2: K, or K rounded up to even with bf16), in two halves:
 * i8_x_alloc before the parallel region (a buffer for bf16 copies, or NULL: x itself is read;
 * *fail on no memory), i8_x_rows inside it. A few rows (decode): every thread converts all of x into
 * its own copy, with no barrier between converting and multiplying; more rows: each thread converts
 * its share of one copy and waits for the others. */
static inline uint16_t *i8_x_alloc(int64_t M, int64_t K2, int nthreads, int *fail) {
    *fail = 0;
#if I8_BF16
    const int64_t copies = M <= I8_OWN_ROWS && nthreads > 1 ? nthreads : 1;
    uint16_t *xb = aligned_alloc(64, (size_t)(copies * M * K2 * 2 + 63) & ~(size_t)63);
    *fail = xb == NULL;
    return xb;
#else
    (void)M; (void)K2; (void)nthreads;
    return NULL;
#endif
}

static inline const i8_x *i8_x_rows(const float *x, uint16_t *xb, int64_t M, int64_t K, int64_t K2) {
#if I8_BF16
    const int own = M <= I8_OWN_ROWS;
    int64_t r0 = 0, r1 = M;
#ifdef _OPENMP
    uint16_t *xbc = xb + (own ? omp_get_thread_num() : 0) * M * K2;
#else
    uint16_t *xbc = xb;
#endif
    if (!own) omp_range(M, &r0, &r1);
    x_rows_to_bf16(x + r0 * K, xbc + r0 * K2, r1 - r0, K, K2);
    if (!own) {
        #pragma omp barrier
    }
    return xbc;
#else
    (void)xb; (void)M; (void)K; (void)K2;
    return x;
#endif
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
