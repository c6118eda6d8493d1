/* y[M, N] = x[M, K] @ W^T for GGUF's non-linear 4-bit grids, values and scales as the file stores them,
 * fp32 x and y (weight-only: x is not quantized): w = d * v[q], q a 4-bit code, v IQ4_NL's table of 16
 * int8 values, in groups of 32 k:
 *   IQ4_NL (B = 32):  d one fp16 scale per 32 k
 *   IQ4_XS (B = 256): d = D * s, s one int8 (its 6-bit scale minus 32) per 32 k, D one fp16 per 256 k,
 *                     D * s formed in fp32 (exact: 11 by 6 bits)
 *   P[g][k/8][NC] uint32: the codes in gemm_int4.c's nibble layout (ridgeline_pack_i4)
 *   S: [g][k/32][NC] fp16 d (IQ4_NL); [g][k/32][NC] int8 s, then [g][k/256][NC] fp16 D (IQ4_XS)
 * A word permute (vpermw) maps each code, in the low bits of its 16-bit half, to its value as bf16 (exact:
 * every value has at most 7 significant bits), a vdpbf16ps operand; the table is repeated in both halves
 * of the 32-entry index space, so the bit above the code does not matter. x is rounded to bf16 as for the
 * int4 kernel. Per group the partial S = sum x v starts from zero and folds into fp32 sums by d; an
 * output's arithmetic does not depend on M or on the tile shape (a lone row takes two column groups at
 * once), so a row's result does not depend on its batch. K is a multiple of B. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_grid.h"

#define IQ4G 32

int ridgeline_iq4_available(void) {
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define IQ4_MR 4

/* IQ4_NL's values -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 as bf16, twice */
static const uint16_t IQ4_BF16[32] = {
    0xC2FE, 0xC2D0, 0xC2A6, 0xC282, 0xC244, 0xC20C, 0xC1B0, 0xC120, 0x3F80, 0x4150, 0x41C8, 0x4218, 0x4254, 0x428A,
    0x42B2, 0x42E2, 0xC2FE, 0xC2D0, 0xC2A6, 0xC282, 0xC244, 0xC20C, 0xC1B0, 0xC120, 0x3F80, 0x4150, 0x41C8, 0x4218,
    0x4254, 0x428A, 0x42B2, 0x42E2};

/* nibble pair j (codes at bits 4 j and 16 + 4 j of W[v]) against every row */
#define IQ4_PAIR(j) \
    for (int v = 0; v < nv; v++) { \
        const __m512bh wq = (__m512bh)_mm512_permutexvar_epi16((j) ? _mm512_srli_epi32(W[v], 4 * (j)) : W[v], table); \
        for (int i = 0; i < mr; i++) { \
            int32_t pair; \
            memcpy(&pair, xg + i * ldx + 8 * o + 2 * (j), 4); \
            S[i][v] = _mm512_dpbf16_ps(S[i][v], (__m512bh)_mm512_set1_epi32(pair), wq); \
        } \
    }

/* mr rows of xb (bf16, stride ldx) against ng (1 or 2) consecutive column groups (code stride gs words;
 * scales: sc with stride ss elements, fp16 (nl) or int8 by dd's fp16 per 256 k with stride sd), kg groups
 * of 32 from this block's start (a multiple of 256 for IQ4_XS) -> y rows at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_iq4(const int mr, const int ng, const int xs, const uint32_t *pw, int64_t gs, const void *sc, int64_t ss,
        const uint16_t *dd, int64_t sd, const uint16_t *xb, int64_t ldx, float *y, int64_t n0, int64_t N, int64_t kg,
        int flags) {
    const __m512i table = _mm512_loadu_si512(IQ4_BF16);
    const int nv = ng * QT_NR;
    __m512 acc[IQ4_MR][2 * QT_NR];
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t b = 0; b < kg; b++) {
        __m512 S[IQ4_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) S[i][v] = _mm512_setzero_ps();
        const uint16_t *xg = xb + b * IQ4G;
        for (int o = 0; o < 4; o++) {
            __m512i W[2 * QT_NR];
            for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + (b * 4 + o) * QT_NC, QT_NR, mr);
            for (int v = 0; v < nv; v++)
                W[v] = _mm512_loadu_si512(pw + (v / QT_NR) * gs + (b * 4 + o) * QT_NC + 16 * (v % QT_NR));
            IQ4_PAIR(0) IQ4_PAIR(1) IQ4_PAIR(2) IQ4_PAIR(3)
        }
        for (int v = 0; v < nv; v++) {
            const int64_t at = (v / QT_NR) * ss + b * QT_NC + 16 * (v % QT_NR);
            __m512 d;
            if (xs)
                d = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                      (const __m128i *)((const int8_t *)sc + at)))),
                                  _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(
                                      dd + (v / QT_NR) * sd + b / 8 * QT_NC + 16 * (v % QT_NR)))));
            else
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)sc + at)));
            for (int i = 0; i < mr; i++) acc[i][v] = _mm512_fmadd_ps(S[i][v], d, acc[i][v]);
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_iq4_fn)(const uint32_t *, int64_t, const void *, int64_t, const uint16_t *, int64_t,
                           const uint16_t *, int64_t, float *, int64_t, int64_t, int64_t, int);
#define UKR_IQ4(R, NG, XS) \
    static void ukr_iq4_##R##_##NG##_##XS(const uint32_t *pw, int64_t gs, const void *sc, int64_t ss, \
                                          const uint16_t *dd, int64_t sd, const uint16_t *xb, int64_t ldx, float *y, \
                                          int64_t n0, int64_t N, int64_t kg, int flags) { \
        ukr_iq4(R, NG, XS, pw, gs, sc, ss, dd, sd, xb, ldx, y, n0, N, kg, flags); \
    }
UKR_IQ4(1, 2, 0) UKR_IQ4(1, 1, 0) UKR_IQ4(2, 1, 0) UKR_IQ4(3, 1, 0) UKR_IQ4(4, 1, 0)
UKR_IQ4(1, 2, 1) UKR_IQ4(1, 1, 1) UKR_IQ4(2, 1, 1) UKR_IQ4(3, 1, 1) UKR_IQ4(4, 1, 1)
static const ukr_iq4_fn UKRS_IQ4[2][IQ4_MR + 1] = {
    {0, ukr_iq4_1_1_0, ukr_iq4_2_1_0, ukr_iq4_3_1_0, ukr_iq4_4_1_0},
    {0, ukr_iq4_1_1_1, ukr_iq4_2_1_1, ukr_iq4_3_1_1, ukr_iq4_4_1_1}};
static const ukr_iq4_fn UKRS_IQ4_WIDE[2] = {ukr_iq4_1_2_0, ukr_iq4_1_2_1};

typedef struct {
    const uint32_t *p;
    const uint8_t *s;   /* fp16 d (nl) or int8 s (xs) */
    const uint16_t *d;  /* xs: fp16 D per 256 k */
    const float *x;
    float *y;
    int64_t M, N, K;
    int xs;
} iq4_args;

static void tile_iq4(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                     int flags) {
    const iq4_args *a = args;
    const int64_t KG = a->K / IQ4G, gs = a->K / 8 * QT_NC, ss = KG * QT_NC, sd = a->K / 256 * QT_NC;
    const int64_t at = g * ss + k0 / IQ4G * QT_NC, esz = a->xs ? 1 : 2;
    const ukr_iq4_fn f = ng == 2 ? UKRS_IQ4_WIDE[a->xs] : UKRS_IQ4[a->xs][mr];
    f(a->p + g * gs + k0 / 8 * QT_NC, gs, a->s + at * esz, ss, a->xs ? a->d + g * sd + k0 / 256 * QT_NC : NULL, sd,
      (const uint16_t *)ws + m * a->K + k0, a->K, a->y + m * a->N, g * QT_NC, a->N, kc / IQ4G, flags);
}

/* the driver's prep: rows [r0, r1) of x rounded to bf16 (nearest even) */
static void prep_iq4(const void *args, void *ws, int64_t r0, int64_t r1) {
    const iq4_args *a = args;
    const int64_t K = a->K;
    uint16_t *xb = (uint16_t *)ws;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k0 = 0; k0 < K; k0 += IQ4G) {
            const __m512 lo = _mm512_loadu_ps(a->x + r * K + k0), hi = _mm512_loadu_ps(a->x + r * K + k0 + 16);
            _mm512_storeu_si512(xb + r * K + k0, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
}
#endif

/* p: ridgeline_pack_i4's layout of the codes; s: the scales as above; B 32 (IQ4_NL) or 256 (IQ4_XS) */
int ridgeline_gemm_iq4(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int64_t B, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
    if (M < 1 || N < 1 || K < 1 || (B != 32 && B != 256) || K % B) return -1;
    const int64_t G = (N + QT_NC - 1) / QT_NC, KC = qt_k_block(M, K, 2, B);
    const int xs = B == 256;
    const iq4_args a = {p, s, xs ? (const uint16_t *)(s + G * (K / IQ4G) * QT_NC) : NULL, x, y, M, N, K, xs};
    const td_plan plan = grid_plan(M, N, K, KC, IQ4_MR, 0);
    return ridgeline_td_run(&plan, &a, prep_iq4, tile_iq4, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)B; (void)nthreads;
    return -2;
#endif
}
