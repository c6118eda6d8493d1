/* y[M, N] = x[M, K] @ W^T for group-wise int4 weights, fp32 x and y (weight-only: x is not quantized).
 * Groups of G = 32, 64 or 128 consecutive k of one output channel share an fp16 scale d and, when
 * asymmetric, an fp16 minimum m (GGUF Q4_1's grid): w = d * q + m, or symmetric w = d * (q - 8);
 * q in [0, 15]. K is a multiple of G.
 *   P[g][k/8][NC] uint32: column c's q for k = 8o..8o+7, nibble j (bits 4j..) holds k = 8o + 2j and
 *                         nibble j + 4 (bits 4j + 16..) k = 8o + 2j + 1, j < 4
 *   S[g][k/G][2][NC] fp16: d, then m (asymmetric); S[g][k/G][NC]: d (symmetric)
 * Dequantizing is two instructions per 32 weights: a shift brings a pair of nibbles to bits 3..6 and
 * 19..22 of each lane, and one vpternlogd masks them into bf16 exponent 16, so each 16-bit half reads
 * 16 + q exactly: a vdpbf16ps operand. x is rounded to bf16 as for the bf16 packed kernel, and per
 * group the dot product S = sum x (16 + q) gives sum x w = d * S + (m - 16 d) * X, X = sum x over
 * the group (symmetric: d * S - 24 d * X). Per group the partial S starts from zero and folds into
 * fp32 sums; an output's arithmetic does not depend on M or on the tile shape (a single row takes
 * two groups at once for more independent chains), so a row's result does not depend on its batch.
 * W4A8 later reuses q, d and m unchanged (vpdpbusd takes u8 q against s8 x; m needs X as here). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_grid.h"

int ridgeline_int4_available(void) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

/* q [N, K] uint8 in [0, 15] -> p [groups][K/8][NC] uint32; K a multiple of 8 */
int ridgeline_pack_i4(const uint8_t *q, uint32_t *p, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC, O = K / 8;
    if (K % 8) return -1;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                uint32_t word = 0;
                for (int j = 0; n < N && j < 4; j++) {
                    const uint8_t *src = q + n * K + 8 * o + 2 * j;
                    word |= (uint32_t)(src[0] & 15) << (4 * j) | (uint32_t)(src[1] & 15) << (4 * j + 16);
                }
                p[(g * O + o) * QT_NC + c] = word;
            }
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define I4_MR 4

/* one pair of k (nibble pair j) of every vector against every row: S[i][v] += x pair . (16 + q) */
#define I4_PAIR(j, SHIFTED) \
    for (int v = 0; v < nv; v++) { \
        const __m512i t = SHIFTED; \
        const __m512bh wq = (__m512bh)_mm512_ternarylogic_epi32(t, nib, magic, 0xEA); /* (t & nib) | magic */ \
        for (int i = 0; i < mr; i++) { \
            int32_t pair; \
            memcpy(&pair, xg + i * ldx + 8 * o + 2 * (j), 4); \
            S[i][v] = _mm512_dpbf16_ps(S[i][v], (__m512bh)_mm512_set1_epi32(pair), wq); \
        } \
    }

/* mr rows of xb (bf16, stride ldx) and their group sums xs (stride ldxs) against ng (1 or 2)
 * consecutive column groups (stride gs words, scale stride ss halves), kg k-groups from this block's
 * start -> y rows at columns n0.. */
/* mode 0: fp16 d and m per group; 1: fp16 d per group (symmetric); 2: Q4_K's grid (ridgeline_gemm_i4k): per group
 * of 32 a byte scale c and a byte minimum n (sc [k/32][2][NC] bytes), per 256 k fp16 D and Dmin (dd [k/256][2][NC],
 * stride sd halves): d = D c, m = -(Dmin n), formed in fp32 */
static inline __attribute__((always_inline)) void
ukr_i4(const int mr, const int ng, const int sym, const uint32_t *pw, int64_t gs, const uint16_t *sc, int64_t ss,
       const uint16_t *xb, int64_t ldx, const float *xs, int64_t ldxs, float *y, int64_t n0, int64_t N, int64_t kg,
       int64_t G, int flags, const uint16_t *dd, int64_t sd) {
    const __m512i nib = _mm512_set1_epi32(0x00780078), magic = _mm512_set1_epi32(0x41804180);
    const int nv = ng * QT_NR, sn = sym == 1 ? 1 : 2;
    __m512 acc[I4_MR][2 * QT_NR];
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t b = 0; b < kg; b++) {
        __m512 S[I4_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) S[i][v] = _mm512_setzero_ps();
        const uint16_t *xg = xb + b * G;
        for (int64_t o = 0; o < G / 8; o++) {
            __m512i W[2 * QT_NR];
            for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + (b * (G / 8) + o) * QT_NC, QT_NR, mr);
            for (int v = 0; v < nv; v++)
                W[v] = _mm512_loadu_si512(pw + (v / QT_NR) * gs + (b * (G / 8) + o) * QT_NC + 16 * (v % QT_NR));
            I4_PAIR(0, _mm512_slli_epi32(W[v], 3))
            I4_PAIR(1, _mm512_srli_epi32(W[v], 1))
            I4_PAIR(2, _mm512_srli_epi32(W[v], 5))
            I4_PAIR(3, _mm512_srli_epi32(W[v], 9))
        }
        for (int v = 0; v < nv; v++) {
            __m512 d, m;
            if (sym == 2) { /* byte scale and minimum by the super-block's fp16 pair */
                grid_kscales((const uint8_t *)sc + (v / QT_NR) * ss + b * 2 * QT_NC + 16 * (v % QT_NR),
                             dd + (v / QT_NR) * sd + b / (256 / 32) * 2 * QT_NC + 16 * (v % QT_NR), &d, &m);
            } else {
                const uint16_t *sv = sc + (v / QT_NR) * ss + b * sn * QT_NC + 16 * (v % QT_NR);
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sv));
                m = sym ? d : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sv + QT_NC)));
            }
            const __m512 mo = sym == 1 ? _mm512_mul_ps(d, _mm512_set1_ps(-24.f))
                                       : _mm512_fnmadd_ps(_mm512_set1_ps(16.f), d, m);
            for (int i = 0; i < mr; i++) {
                acc[i][v] = _mm512_fmadd_ps(S[i][v], d, acc[i][v]);
                acc[i][v] = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * ldxs + b]), mo, acc[i][v]);
            }
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_i4_fn)(const uint32_t *, int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t,
                          const float *, int64_t, float *, int64_t, int64_t, int64_t, int64_t, int, const uint16_t *,
                          int64_t);
#define UKR_I4(R, NG, SYM) \
    static void ukr_i4_##R##_##NG##_##SYM(const uint32_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, \
                                          const uint16_t *xb, int64_t ldx, const float *xs, int64_t ldxs, float *y, \
                                          int64_t n0, int64_t N, int64_t kg, int64_t G, int flags, \
                                          const uint16_t *dd, int64_t sd) { \
        ukr_i4(R, NG, SYM, pw, gs, sc, ss, xb, ldx, xs, ldxs, y, n0, N, kg, G, flags, dd, sd); \
    }
UKR_I4(1, 2, 0) UKR_I4(1, 1, 0) UKR_I4(2, 1, 0) UKR_I4(3, 1, 0) UKR_I4(4, 1, 0)
UKR_I4(1, 2, 1) UKR_I4(1, 1, 1) UKR_I4(2, 1, 1) UKR_I4(3, 1, 1) UKR_I4(4, 1, 1)
UKR_I4(1, 2, 2) UKR_I4(1, 1, 2) UKR_I4(2, 1, 2) UKR_I4(3, 1, 2) UKR_I4(4, 1, 2)
static const ukr_i4_fn UKRS_I4[3][I4_MR + 1] = {{0, ukr_i4_1_1_0, ukr_i4_2_1_0, ukr_i4_3_1_0, ukr_i4_4_1_0},
                                                {0, ukr_i4_1_1_1, ukr_i4_2_1_1, ukr_i4_3_1_1, ukr_i4_4_1_1},
                                                {0, ukr_i4_1_1_2, ukr_i4_2_1_2, ukr_i4_3_1_2, ukr_i4_4_1_2}};
static const ukr_i4_fn UKRS_I4_WIDE[3] = {ukr_i4_1_2_0, ukr_i4_1_2_1, ukr_i4_1_2_2};

typedef struct {
    const uint32_t *p;
    const uint16_t *s;  /* mode 2: the byte scales and minimums, then the fp16 D and Dmin */
    const float *x;
    float *y;
    int64_t M, N, K, G;
    int sym;  /* the mode: 0 asymmetric, 1 symmetric, 2 Q4_K's grid */
} i4_args;

/* the prepared x: xb [M][K] bf16, then xs [M][K/G] fp32 (64-byte aligned: K is a multiple of 32) */
static inline float *i4_sums(const i4_args *a, const void *ws) {
    return (float *)((uint16_t *)ws + a->M * a->K);
}

/* the driver's tile: rows [m, m + mr), column groups [g, g + ng), k in [k0, k0 + kc) (whole
 * quantization groups) */
static void tile_i4(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                    int flags) {
    const i4_args *a = args;
    const int64_t KG = a->K / a->G, gs = a->K / 8 * QT_NC, ss = KG * (a->sym == 1 ? 1 : 2) * QT_NC;
    const uint32_t *pw = a->p + g * gs + k0 / 8 * QT_NC;
    const uint16_t *sc = a->s + g * ss + k0 / a->G * (a->sym == 1 ? 1 : 2) * QT_NC, *dd = NULL;
    int64_t sd = 0;
    if (a->sym == 2) { /* bytes: ss of them per column group; then the fp16 pairs per 256 k */
        const int64_t G = (a->N + QT_NC - 1) / QT_NC;
        sc = (const uint16_t *)((const uint8_t *)a->s + g * ss + k0 / 32 * 2 * QT_NC);
        sd = a->K / 256 * 2 * QT_NC;
        dd = (const uint16_t *)((const uint8_t *)a->s + G * ss) + g * sd + k0 / 256 * 2 * QT_NC;
    }
    const ukr_i4_fn f = ng == 2 ? UKRS_I4_WIDE[a->sym] : UKRS_I4[a->sym][mr];
    f(pw, gs, sc, ss, (const uint16_t *)ws + m * a->K + k0, a->K, i4_sums(a, ws) + m * KG + k0 / a->G, KG,
      a->y + m * a->N, g * QT_NC, a->N, kc / a->G, a->G, flags, dd, sd);
}

/* x [M, K] fp32 -> xb [M, K] bf16 (round to nearest even) and xs [M, K/G]: each group's sum of xb */
static void to_bf16_groups(const float *x, uint16_t *xb, float *xs, int64_t M, int64_t K, int64_t G) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k0 = 0; k0 < K; k0 += G) {
            __m512 sum = _mm512_setzero_ps();
            for (int64_t k = k0; k < k0 + G; k += 32) {
                const __m512 a = _mm512_loadu_ps(x + m * K + k), b = _mm512_loadu_ps(x + m * K + k + 16);
                const __m512bh v = _mm512_cvtne2ps_pbh(b, a);
                _mm512_storeu_si512(xb + m * K + k, (__m512i)v);
                const __m512i w = (__m512i)v; /* bf16 -> fp32: the 16 bits become the high half */
                sum = _mm512_add_ps(sum, (__m512)_mm512_slli_epi32(w, 16));
                sum = _mm512_add_ps(sum, (__m512)_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
            }
            xs[m * (K / G) + k0 / G] = _mm512_reduce_add_ps(sum);
        }
}

/* the driver's prep: rows [r0, r1) of x rounded to bf16, and their group sums */
static void prep_i4(const void *args, void *ws, int64_t r0, int64_t r1) {
    const i4_args *a = args;
    to_bf16_groups(a->x + r0 * a->K, (uint16_t *)ws + r0 * a->K, i4_sums(a, ws) + r0 * (a->K / a->G), r1 - r0, a->K,
                   a->G);
}
#endif

int ridgeline_gemm_i4p(const uint32_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                       int64_t K, int64_t G, int sym, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1 || (G != 32 && G != 64 && G != 128) || K % G) return -1;
    const int64_t KC = qt_k_block(M, K, 2, G);
    const i4_args a = {p, s, x, y, M, N, K, G, sym != 0};
    const td_plan plan = grid_plan(M, N, K, KC, I4_MR, G);
    return ridgeline_td_run(&plan, &a, prep_i4, tile_i4, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)G; (void)sym; (void)nthreads;
    return -2;
#endif
}

/* GGUF Q4_K's grid as stored: p as ridgeline_gemm_i4p's (groups of 32); s: [groups][K/32][2][NC] bytes (the 6-bit
 * scale c and minimum n of each 32), then [groups][K/256][2][NC] fp16 (D, Dmin): w = D c q - Dmin n. K a multiple
 * of 256. */
int ridgeline_gemm_i4k(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1 || K % 256) return -1;
    const int64_t KC = qt_k_block(M, K, 2, 256);
    const i4_args a = {p, (const uint16_t *)s, x, y, M, N, K, 32, 2};
    const td_plan plan = grid_plan(M, N, K, KC, I4_MR, 32);
    return ridgeline_td_run(&plan, &a, prep_i4, tile_i4, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
