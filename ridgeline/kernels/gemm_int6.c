/* y[M, N] = x[M, K] @ W^T for GGUF Q6_K's grid, its values and scales as the file stores them, fp32 x
 * and y (weight-only: x is not quantized): w = d * s * (q - 32), q in [0, 63], s one int8 scale per 16 k,
 * d one fp16 scale per 256 k. K is a multiple of 256.
 *   P[g][k/16][3][NC] uint32: column c's 8 k pairs of each 16 (pair p: k = 16 b + 2 p + h, h < 2) in three
 *                             words A, B, C: pairs 0, 1 in A, 2, 3 in B, 4, 5 in C at bits 16 h + 6 (p % 2);
 *                             pair 6's low 4 bits at A's bits 16 h + 12, pair 7's at C's, and their top 2
 *                             bits at B's bits 16 h + 12 (pair 6) and 16 h + 14 (pair 7): 6 bits a weight
 *   S: [g][k/16][NC] int8 s, then [g][k/256][NC] fp16 d
 * A pair's values are shifted to bits 0..5 of each 16-bit half (none for pairs 0, 2, 4) and masked over bf16
 * exponent 128 by one vpternlogd, so each half reads 128 + q exactly (a 7-bit mantissa holds q); pairs 6 and 7
 * take two shifts and two vpternlogd each: seventeen instructions for eight pairs. x is rounded to bf16 as for
 * the int4 kernel; per group of 16, S = sum x (128 + q) and X = sum x give sum x w = d s (S - 160 X), d s
 * formed in fp32 (exact: 11 by 8 bits). Per group the partial S starts from zero and folds into fp32 sums; an
 * output's arithmetic does not depend on M or on the tile shape (a lone row takes two column groups at once),
 * so a row's result does not depend on its batch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_grid.h"

#define I6G 16   /* k per scale s */
#define I6D 256  /* k per scale d */

/* q [N, K] uint8, bits 4..5 -> h [groups][K/16][NC] uint32: of group k0 = 16 b, k = k0 + 8 o + 2 j + h (o < 2,
 * j < 4, h < 2) holds bits 16 h + 8 o + 2 j and the next (gemm_kq.c's low bit pairs of Q3_K and Q2_K) */
int ridgeline_pack_i6_high(const uint8_t *q, uint32_t *h, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC, B = K / I6G;
    if (K % I6D) return -1;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                uint32_t word = 0;
                for (int r = 0; n < N && r < I6G; r++) {
                    const int o = r / 8, j = (r % 8) / 2, half = r % 2;
                    word |= (uint32_t)((q[n * K + b * I6G + r] >> 4) & 3) << (16 * half + 8 * o + 2 * j);
                }
                h[(g * B + b) * QT_NC + c] = word;
            }
    return 0;
}

/* q [N, K] uint8 in [0, 63] -> p [groups][K/16][3][NC] uint32 (above) */
int ridgeline_pack_i6(const uint8_t *q, uint32_t *p, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC, B = K / I6G;
    if (K % I6D) return -1;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                uint32_t w[3] = {0, 0, 0};
                for (int h = 0; n < N && h < 2; h++) {
                    const uint8_t *src = q + n * K + b * I6G + h;
                    for (int pr = 0; pr < 6; pr++) w[pr / 2] |= (uint32_t)(src[2 * pr] & 63) << (16 * h + 6 * (pr % 2));
                    const uint32_t q6 = src[12] & 63, q7 = src[14] & 63;
                    w[0] |= (q6 & 15) << (16 * h + 12);
                    w[2] |= (q7 & 15) << (16 * h + 12);
                    w[1] |= (q6 >> 4) << (16 * h + 12) | (q7 >> 4) << (16 * h + 14);
                }
                for (int i = 0; i < 3; i++) p[((g * B + b) * 3 + i) * QT_NC + c] = w[i];
            }
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define I6_MR 4

/* pair PR of the column group's three vectors u (their bf16 operands WQ) against every row:
 * S[i][3 c + u] += x pair . (128 + q) */
#define I6_DOT(PR, WQ) \
    { \
        __m512bh xp[I6_MR]; \
        for (int i = 0; i < mr; i++) { \
            int32_t pair; \
            memcpy(&pair, xg + i * ldx + 2 * (PR), 4); \
            xp[i] = (__m512bh)_mm512_set1_epi32(pair); \
        } \
        for (int u = 0; u < QT_NR; u++) { \
            const __m512bh wq = (__m512bh)(WQ); \
            for (int i = 0; i < mr; i++) S[i][QT_NR * c + u] = _mm512_dpbf16_ps(S[i][QT_NR * c + u], xp[i], wq); \
        } \
    }

/* mr rows of xb (bf16, stride ldx) and their group sums xs (stride ldxs) against ng (1 or 2) consecutive
 * column groups (word stride gs, s stride ss bytes, d stride sd halves), kg groups of 16 from this block's
 * start (a multiple of 256) -> y rows at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_i6(const int mr, const int ng, const uint32_t *pw, int64_t gs, const int8_t *s8, int64_t ss, const uint16_t *dd,
       int64_t sd, const uint16_t *xb, int64_t ldx, const float *xs, int64_t ldxs, float *y, int64_t n0, int64_t N,
       int64_t kg, int flags) {
    const __m512i six = _mm512_set1_epi32(0x003F003F), low4 = _mm512_set1_epi32(0x000F000F),
                  top2 = _mm512_set1_epi32(0x00300030), magic = _mm512_set1_epi32(0x43004300);
    const int nv = ng * QT_NR;
    __m512 acc[I6_MR][2 * QT_NR];
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t b = 0; b < kg; b++) {
        __m512 S[I6_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) S[i][v] = _mm512_setzero_ps();
        for (int c = 0; c < ng; c++) {
            for (int w = 0; w < 3; w++) w_prefetch(pw + c * gs + (b * 3 + w) * QT_NC, QT_NR, mr);
            if (b % 4 == 0) w_prefetch_at(s8 + c * ss + b * QT_NC, 3, mr, W_PF_BYTES / 12);
        }
        const uint16_t *xg = xb + b * I6G;
        for (int c = 0; c < ng; c++) { /* one column group's words at a time: 9 registers */
            __m512i A[QT_NR], B[QT_NR], C[QT_NR];
            for (int u = 0; u < QT_NR; u++) {
                const uint32_t *wv = pw + c * gs + b * 3 * QT_NC + 16 * u;
                A[u] = _mm512_loadu_si512(wv);
                B[u] = _mm512_loadu_si512(wv + QT_NC);
                C[u] = _mm512_loadu_si512(wv + 2 * QT_NC);
            }
            I6_DOT(0, _mm512_ternarylogic_epi32(A[u], six, magic, 0xEA)) /* (t & 63) | 128 */
            I6_DOT(1, _mm512_ternarylogic_epi32(_mm512_srli_epi32(A[u], 6), six, magic, 0xEA))
            I6_DOT(2, _mm512_ternarylogic_epi32(B[u], six, magic, 0xEA))
            I6_DOT(3, _mm512_ternarylogic_epi32(_mm512_srli_epi32(B[u], 6), six, magic, 0xEA))
            I6_DOT(4, _mm512_ternarylogic_epi32(C[u], six, magic, 0xEA))
            I6_DOT(5, _mm512_ternarylogic_epi32(_mm512_srli_epi32(C[u], 6), six, magic, 0xEA))
            I6_DOT(6, _mm512_ternarylogic_epi32(_mm512_srli_epi32(B[u], 8), top2,
                                                _mm512_ternarylogic_epi32(_mm512_srli_epi32(A[u], 12), low4, magic, 0xEA),
                                                0xEA))
            I6_DOT(7, _mm512_ternarylogic_epi32(_mm512_srli_epi32(B[u], 10), top2,
                                                _mm512_ternarylogic_epi32(_mm512_srli_epi32(C[u], 12), low4, magic, 0xEA),
                                                0xEA))
        }
        for (int v = 0; v < nv; v++) {
            const int64_t col = 16 * (v % QT_NR);
            const __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(s8 + (v / QT_NR) * ss + b * QT_NC + col))));
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(
                (const __m256i *)(dd + (v / QT_NR) * sd + b / (I6D / I6G) * QT_NC + col)));
            const __m512 ds = _mm512_mul_ps(d, s), mo = _mm512_mul_ps(ds, _mm512_set1_ps(-160.f));
            for (int i = 0; i < mr; i++) {
                acc[i][v] = _mm512_fmadd_ps(S[i][v], ds, acc[i][v]);
                acc[i][v] = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * ldxs + b]), mo, acc[i][v]);
            }
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_i6_fn)(const uint32_t *, int64_t, const int8_t *, int64_t, const uint16_t *, int64_t,
                          const uint16_t *, int64_t, const float *, int64_t, float *, int64_t, int64_t, int64_t, int);
#define UKR_I6(R, NG) \
    static void ukr_i6_##R##_##NG(const uint32_t *pw, int64_t gs, const int8_t *s8, int64_t ss, const uint16_t *dd, \
                                  int64_t sd, const uint16_t *xb, int64_t ldx, const float *xs, int64_t ldxs, \
                                  float *y, int64_t n0, int64_t N, int64_t kg, int flags) { \
        ukr_i6(R, NG, pw, gs, s8, ss, dd, sd, xb, ldx, xs, ldxs, y, n0, N, kg, flags); \
    }
UKR_I6(1, 2) UKR_I6(1, 1) UKR_I6(2, 1) UKR_I6(3, 1) UKR_I6(4, 1)
static const ukr_i6_fn UKRS_I6[I6_MR + 1] = {0, ukr_i6_1_1, ukr_i6_2_1, ukr_i6_3_1, ukr_i6_4_1};

typedef struct {
    const uint32_t *p;
    const int8_t *s;
    const uint16_t *d;
    const float *x;
    float *y;
    int64_t M, N, K;
} i6_args;

/* the prepared x: xb [M][K] bf16, then xs [M][K/16] fp32 */
static inline float *i6_sums(const i6_args *a, const void *ws) {
    return (float *)((uint16_t *)ws + a->M * a->K);
}

static void tile_i6(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                    int flags) {
    const i6_args *a = args;
    const int64_t KG = a->K / I6G, gs = KG * 3 * QT_NC, ss = KG * QT_NC, sd = a->K / I6D * QT_NC;
    const uint32_t *pw = a->p + g * gs + k0 / I6G * 3 * QT_NC;
    const int8_t *s8 = a->s + g * ss + k0 / I6G * QT_NC;
    const uint16_t *dd = a->d + g * sd + k0 / I6D * QT_NC;
    const ukr_i6_fn f = ng == 2 ? ukr_i6_1_2 : UKRS_I6[mr];
    f(pw, gs, s8, ss, dd, sd, (const uint16_t *)ws + m * a->K + k0, a->K, i6_sums(a, ws) + m * KG + k0 / I6G, KG,
      a->y + m * a->N, g * QT_NC, a->N, kc / I6G, flags);
}

/* the driver's prep: rows [r0, r1) of x rounded to bf16, and each 16's sum of them */
static void prep_i6(const void *args, void *ws, int64_t r0, int64_t r1) {
    const i6_args *a = args;
    grid_prep16(a->x, (uint16_t *)ws, i6_sums(a, ws), r0, r1, a->K);
}
#endif

/* p: ridgeline_pack_i6's words of q; s: the int8 scales s, then the fp16 scales d, as above */
int ridgeline_gemm_i6p(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1 || K % I6D) return -1;
    const int64_t G = (N + QT_NC - 1) / QT_NC, KC = qt_k_block(M, K, 2, I6D);
    const i6_args a = {p, (const int8_t *)s, (const uint16_t *)(s + G * (K / I6G) * QT_NC), x, y, M, N, K};
    const td_plan plan = grid_plan(M, N, K, KC, I6_MR, I6G);
    return ridgeline_td_run(&plan, &a, prep_i6, tile_i6, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
