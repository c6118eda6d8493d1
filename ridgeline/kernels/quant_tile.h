/* What the quantized matmuls (gemm_int8.c, gemm_int4.c, ...) share: the packed column group (NC = 48
 * output columns, three vectors, as in gemm_packed.c), the blocking of x (a block of rows by a block
 * of k that fits L2 while a thread's groups stream past; tile_driver.h walks it) and the start/store
 * of a tile of y. A k block after the first continues from the partial sums stored in y, so blocking
 * never changes an output's arithmetic. */
#pragma once
#include <stdint.h>

#include "tile_driver.h"
#include "weight_prefetch.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define QT_NR 3
#define QT_NC (QT_NR * 16)
#define QT_X_BYTES (768 * 1024) /* a block of x: most of L2 */
#define QT_KC_MAX 1024          /* k per block at most */

/* k per block: all of K when the whole x fits a block, else K split evenly into blocks of at most
 * QT_KC_MAX, each a multiple of `align` (a quantization group); elem: bytes per element of x */
static inline int64_t qt_k_block(int64_t M, int64_t K, int64_t elem, int64_t align) {
    if (M * K * elem <= QT_X_BYTES || K <= align) return K;
    const int64_t units = K / align, per = QT_KC_MAX / align > 0 ? QT_KC_MAX / align : 1;
    const int64_t nb = (units + per - 1) / per;
    return (units + nb - 1) / nb * align;
}

static inline int64_t qt_chunk_rows(int64_t kc, int64_t elem, int64_t mr) {
    int64_t r = QT_X_BYTES / (kc * elem) / mr * mr;
    return r < mr ? mr : r;
}

#ifdef __AVX512F__
static inline __mmask16 qt_mask(int64_t n0, int64_t N) {
    const int64_t left = N - n0;
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* acc[i * ld + v], i < mr rows, v < nv vectors of 16 columns from n0: zeros, or (TD_ACC) y's partial sums */
static inline __attribute__((always_inline)) void
qt_start(int mr, int nv, int ld, __m512 *acc, const float *y, int64_t n0, int64_t N, int flags) {
    for (int v = 0; v < nv; v++) {
        const __mmask16 m = qt_mask(n0 + 16 * v, N);
        for (int i = 0; i < mr; i++)
            acc[i * ld + v] = flags & TD_ACC ? _mm512_maskz_loadu_ps(m, y + i * N + n0 + 16 * v) : _mm512_setzero_ps();
    }
}

static inline __attribute__((always_inline)) void
qt_store(int mr, int nv, int ld, const __m512 *acc, float *y, int64_t n0, int64_t N) {
    for (int v = 0; v < nv; v++) {
        const __mmask16 m = qt_mask(n0 + 16 * v, N);
        if (m)
            for (int i = 0; i < mr; i++) _mm512_mask_storeu_ps(y + i * N + n0 + 16 * v, m, acc[i * ld + v]);
    }
}
#endif
