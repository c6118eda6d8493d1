/* Rows of fp32 x rounded to bf16 (round to nearest even) for the kernels that take bf16 pairs of x
 * (vdpbf16ps): gemm_int8.c, gemm_int8_g32.c. */
#pragma once
#include <stdint.h>

#include "quant_tile.h"

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
