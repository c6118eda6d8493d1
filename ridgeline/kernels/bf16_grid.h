/* What the kept-grid kernels share (gemm_int5.c, gemm_int6.c, gemm_kq.c): a weight's bits masked over a bf16
 * exponent into one vdpbf16ps operand, and x rounded to bf16 with each group's sum. */
#pragma once
#include <stdint.h>
#include <string.h>

#include "quant_tile.h"

/* the tile driver's plan for a grid kernel whose prep writes x as bf16 rows, then (sum_group > 0) one float per
 * row and sum_group k: M rows by N columns by K, k blocks of KC, tiles of up to mr rows */
static inline td_plan grid_plan(int64_t M, int64_t N, int64_t K, int64_t KC, int mr, int64_t sum_group) {
    const size_t sums = sum_group ? (size_t)(M * (K / sum_group)) * sizeof(float) : 0;
    return (td_plan){.M = M, .groups = (N + QT_NC - 1) / QT_NC, .K = K, .KC = KC, .rows = qt_chunk_rows(KC, 2, mr),
                     .mr = mr, .wide = 1, .ws_bytes = (size_t)(M * K) * 2 + sums, .own_rows = TD_OWN_ROWS,
                     .cols = QT_NC};
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* pair j of every vector v < nv: its low bits (LOW & nib) and high bits (HIGH & top) over the exponent magic
 * read as bf16 z + q, against every row i < mr of the bf16 x pair at xg + i * ldx + 8 o + 2 j: S[i][v] += */
#define GRID_PAIR(j, LOW, HIGH) \
    for (int v = 0; v < nv; v++) { \
        const __m512i t = _mm512_ternarylogic_epi32(LOW, nib, magic, 0xEA); /* (low & nib) | magic */ \
        const __m512bh wq = (__m512bh)_mm512_ternarylogic_epi32(HIGH, top, t, 0xEA); \
        for (int i = 0; i < mr; i++) { \
            int32_t pair; \
            memcpy(&pair, xg + i * ldx + 8 * o + 2 * (j), 4); \
            S[i][v] = _mm512_dpbf16_ps(S[i][v], (__m512bh)_mm512_set1_epi32(pair), wq); \
        } \
    }

/* a K-quant group's scale d = D c and minimum m = -(Dmin n), for 16 columns: c at cv and n at cv + QT_NC (bytes),
 * D at dv and Dmin at dv + QT_NC (fp16), formed in fp32 (exact: 11 by 6 bits) */
static inline __attribute__((always_inline)) void grid_kscales(const uint8_t *cv, const uint16_t *dv, __m512 *d,
                                                               __m512 *m) {
    const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)cv)));
    const __m512 n = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(cv + QT_NC))));
    *d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dv)), c);
    *m = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dv + QT_NC))), n));
}

/* rows [r0, r1) of x [., K] fp32 -> xb [., K] bf16 (nearest even) and xs [., K/16] each 16's sum of xb */
static inline void grid_prep16(const float *x, uint16_t *xb, float *xs, int64_t r0, int64_t r1, int64_t K) {
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k0 = 0; k0 < K; k0 += 16) {
            const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + r * K + k0));
            _mm256_storeu_si256((__m256i *)(xb + r * K + k0), v);
            xs[r * (K / 16) + k0 / 16] = _mm512_reduce_add_ps((__m512)_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
        }
}
#endif
