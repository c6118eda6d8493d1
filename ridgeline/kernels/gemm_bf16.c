/* y[M, N] = x[M, K] @ W[N, K]^T with bf16 W (raw uint16, the layout the model holds), fp32 x and y,
 * for the small-to-medium M of batched decode, where oneDNN's bf16 GEMM runs far below peak here.
 * x is rounded to bf16 once per call; products accumulate in fp32 with AVX512-BF16 dot products
 * (vdpbf16ps: 32 multiply-adds per instruction). Register tile: NR rows of W x MR rows of x, each
 * accumulator a 16-lane partial dot product, folded to scalars by one 16-way transpose-reduce.
 * Rows of W are split across threads; each thread's W tile stays in L1 while every x row passes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "omp_range.h"
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_BF16_DOT 1
#include "reduce16.h"
#endif

int ridgeline_gemm_bf16_available(void) {
#ifdef HAVE_BF16_DOT
    return 1;
#else
    return 0;
#endif
}

#ifdef HAVE_BF16_DOT
#define NR 4
#define MR 4
/* Prefetch W two tiles ahead, into L2 (L1 has too few miss buffers to stream from DRAM): the NR
 * interleaved row streams defeat the hardware prefetcher. */
#define PF_TILES 2
#define PF_HINT _MM_HINT_T1

static inline __m512bh ld_bh(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }
static inline __m512bh ld_bh_tail(const uint16_t *p, __mmask32 t) { return (__m512bh)_mm512_maskz_loadu_epi16(t, p); }

/* A full NR x MR tile: W rows n..n+NR-1, x rows m..m+MR-1, of which the first mc are stored. xb has
 * rows padded to Kp (multiple of 32) and a row count padded to MR, with zeros, so only W needs a
 * masked tail load. pf: prefetch W ahead (the first x block of each W tile only). */
static inline __attribute__((always_inline)) void
tile_full(const uint16_t *w, const uint16_t *xb, float *y, int64_t n, int64_t m, int mc, int64_t N, int64_t K,
          int64_t Kp, const int pf) {
    __m512 acc[NR * MR];
    for (int i = 0; i < NR * MR; i++) acc[i] = _mm512_setzero_ps();
    const int64_t Kf = K & ~(int64_t)31;
    for (int64_t k = 0; k < Kf; k += 32) {
        __m512bh wv[NR], xv[MR];
        for (int r = 0; r < NR; r++) wv[r] = ld_bh(w + (n + r) * K + k);
        for (int c = 0; c < MR; c++) xv[c] = ld_bh(xb + (m + c) * Kp + k);
        if (pf)
            for (int r = 0; r < NR; r++) _mm_prefetch((const char *)(w + (n + PF_TILES * NR + r) * K + k), PF_HINT);
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < MR; c++) acc[r * MR + c] = _mm512_dpbf16_ps(acc[r * MR + c], wv[r], xv[c]);
    }
    if (Kf < K) {
        __mmask32 t = (__mmask32)((1ull << (K - Kf)) - 1);
        __m512bh wv[NR], xv[MR];
        for (int r = 0; r < NR; r++) wv[r] = ld_bh_tail(w + (n + r) * K + Kf, t);
        for (int c = 0; c < MR; c++) xv[c] = ld_bh(xb + (m + c) * Kp + Kf);
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < MR; c++) acc[r * MR + c] = _mm512_dpbf16_ps(acc[r * MR + c], wv[r], xv[c]);
    }
    float out[NR * MR]; /* NR * MR == 16 */
    _mm512_storeu_ps(out, reduce16(acc));
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < mc; c++) y[(m + c) * N + n + r] = out[r * MR + c];
}

/* The last nr < NR rows of W. */
static void tile_edge(const uint16_t *w, const uint16_t *xb, float *y, int64_t n, int64_t m, int nr, int mc,
                      int64_t N, int64_t K, int64_t Kp) {
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < mc; c++) {
            __m512 acc = _mm512_setzero_ps();
            int64_t k = 0;
            for (; k + 32 <= K; k += 32) acc = _mm512_dpbf16_ps(acc, ld_bh(w + (n + r) * K + k), ld_bh(xb + (m + c) * Kp + k));
            if (k < K) {
                __mmask32 t = (__mmask32)((1ull << (K - k)) - 1);
                acc = _mm512_dpbf16_ps(acc, ld_bh_tail(w + (n + r) * K + k, t), ld_bh(xb + (m + c) * Kp + k));
            }
            y[(m + c) * N + n + r] = _mm512_reduce_add_ps(acc);
        }
}

static void to_bf16_padded(const float *x, uint16_t *xb, int64_t M, int64_t Mp, int64_t K, int64_t Kp) {
    memset(xb + M * Kp, 0, (size_t)((Mp - M) * Kp * 2));
    for (int64_t m = 0; m < M; m++) {
        const float *src = x + m * K;
        uint16_t *dst = xb + m * Kp;
        for (int64_t k = 0; k < Kp; k += 32) {
            int64_t left = K - k;
            __mmask16 lo = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __mmask16 hi = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            __m512 a = _mm512_maskz_loadu_ps(lo, src + k), b = _mm512_maskz_loadu_ps(hi, src + k + 16);
            _mm512_storeu_si512(dst + k, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
    }
}
#endif

int ridgeline_gemm_bf16(const uint16_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads) {
#ifdef HAVE_BF16_DOT
    if (M < 1 || N < 1 || K < 1) return -1;
    const int64_t Kp = (K + 31) & ~(int64_t)31;
    const int64_t Mp = (M + MR - 1) / MR * MR;
    uint16_t *xb = aligned_alloc(64, (size_t)(Mp * Kp * 2 + 63) & ~(size_t)63);
    if (!xb) return -3;
    to_bf16_padded(x, xb, M, Mp, K, Kp);
    const int64_t tiles = (N + NR - 1) / NR;
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t t0, t1;
        omp_range(tiles, &t0, &t1);
        for (int64_t ti = t0; ti < t1; ti++) {
            int64_t n = ti * NR;
            int nr = N - n < NR ? (int)(N - n) : NR;
            for (int64_t m = 0; m < M; m += MR) {
                int mc = M - m < MR ? (int)(M - m) : MR;
                if (nr == NR && m == 0) tile_full(w, xb, y, n, m, mc, N, K, Kp, 1);
                else if (nr == NR) tile_full(w, xb, y, n, m, mc, N, K, Kp, 0);
                else tile_edge(w, xb, y, n, m, nr, mc, N, K, Kp);
            }
        }
    }
    free(xb);
    return 0;
#else
    (void)w; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
