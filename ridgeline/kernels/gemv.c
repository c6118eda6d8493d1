/* Skinny matrix multiply y[M, N] = x[M, K] @ W[N, K]^T for M <= 8, the decode hot path on a CPU
 * for fp32 weights (and bf16 ones where the CPU lacks AVX512-BF16: gemm_bf16.c takes them otherwise).
 * W is read exactly once (bandwidth-bound); each W row is multiplied by all M rows of x while in
 * registers. W is bf16 (raw uint16) or fp32; x and y are fp32. Rows of W split across threads. */
#include <stdint.h>
#include <string.h>

#include "omp_range.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define MAXM 8

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#ifdef __AVX512F__
static inline __m512 load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline __m512 load16_bf16_tail(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}
#endif

#define ROW_KERNEL(NAME, WT, LOAD, LOADT, SCALAR)                                                   \
static void NAME(const WT *w, const float *x, float *y, int64_t M, int64_t N, int64_t K,             \
                 int64_t n0, int64_t n1) {                                                          \
    for (int64_t n = n0; n < n1; n++) {                                                             \
        const WT *row = w + n * K;                                                                  \
        float out[MAXM];                                                                            \
        VEC_BODY(LOAD, LOADT)                                                                       \
        for (int64_t m = 0; m < M; m++) y[m * N + n] = out[m];                                      \
    }                                                                                               \
}

#ifdef __AVX512F__
#define VEC_BODY(LOAD, LOADT)                                                                       \
    __m512 acc[MAXM];                                                                               \
    for (int64_t m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();                                   \
    int64_t k = 0;                                                                                  \
    for (; k + 16 <= K; k += 16) {                                                                  \
        __m512 wv = LOAD(row + k);                                                                  \
        for (int64_t m = 0; m < M; m++) acc[m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + m * K + k), acc[m]); \
    }                                                                                               \
    if (k < K) {                                                                                    \
        __mmask16 t = (__mmask16)((1u << (K - k)) - 1);                                             \
        __m512 wv = LOADT(row + k, t);                                                              \
        for (int64_t m = 0; m < M; m++)                                                             \
            acc[m] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(t, x + m * K + k), acc[m]);          \
    }                                                                                               \
    for (int64_t m = 0; m < M; m++) out[m] = _mm512_reduce_add_ps(acc[m]);
#define LOAD_F32(p) _mm512_loadu_ps(p)
#define LOADT_F32(p, t) _mm512_maskz_loadu_ps(t, p)
ROW_KERNEL(rows_bf16, uint16_t, load16_bf16, load16_bf16_tail, 0)
ROW_KERNEL(rows_f32, float, LOAD_F32, LOADT_F32, 0)
#else
#define VEC_BODY(LOAD, LOADT)                                                                       \
    for (int64_t m = 0; m < M; m++) {                                                               \
        float s = 0.f;                                                                              \
        for (int64_t k = 0; k < K; k++) s += LOAD(row[k]) * x[m * K + k];                           \
        out[m] = s;                                                                                 \
    }
#define ID(v) (v)
ROW_KERNEL(rows_bf16, uint16_t, bf16_to_f32, 0, 0)
ROW_KERNEL(rows_f32, float, ID, 0, 0)
#endif

int ridgeline_gemv(const void *w, int is_bf16, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                   int nthreads) {
    if (M < 1 || M > MAXM) return -1;
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t n0, n1;
        omp_range(N, &n0, &n1);
        if (n0 < n1) {
            if (is_bf16) rows_bf16((const uint16_t *)w, x, y, M, N, K, n0, n1);
            else rows_f32((const float *)w, x, y, M, N, K, n0, n1);
        }
    }
    return 0;
}
