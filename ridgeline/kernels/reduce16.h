/* Transpose-reduce of 16 AVX-512 accumulators; include only where __AVX512F__ is defined. */
#pragma once
#include <immintrin.h>

/* lane i of the result = horizontal sum of a[i], for 16 vectors */
static inline __m512 reduce16(const __m512 *a) {
    __m512 s1[8], s2[4], s3[2];
    for (int i = 0; i < 8; i++)
        s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d p = _mm512_castps_pd(s1[2 * i]), q = _mm512_castps_pd(s1[2 * i + 1]);
        s2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(p, q)), _mm512_castpd_ps(_mm512_unpackhi_pd(p, q)));
    }
    for (int i = 0; i < 2; i++)
        s3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* the same for 16 int32 accumulators (exact: integer sums do not depend on their order) */
static inline __m512i reduce16i(const __m512i *a) {
    __m512i s1[8], s2[4], s3[2];
    for (int i = 0; i < 8; i++)
        s1[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                 _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        s2[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(s1[2 * i], s1[2 * i + 1]),
                                 _mm512_unpackhi_epi64(s1[2 * i], s1[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        s3[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i32x4(s2[2 * i], s2[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
