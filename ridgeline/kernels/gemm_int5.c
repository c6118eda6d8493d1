/* y[M, N] = x[M, K] @ W^T for 5-bit weights in groups of 32 k, fp32 x and y (weight-only: x is not
 * quantized): GGUF Q5_0's grid (symmetric, w = d * (q - 16)), Q5_1's (w = d * q + m), one fp16 scale d (and
 * minimum m) per group, and Q5_K's (ridgeline_gemm_i5k); q in [0, 31]. K is a multiple of 32.
 *   P[g][ceil(K/6)][NC] uint32: column c's k pairs in order, three to a word: pair p (k = 2 p, 2 p + 1) is in
 *                                word p / 3 at bits 5 (p % 3) (k even) and 16 + 5 (p % 3) (k odd); bits 15
 *                                and 31 are zero. 5.33 bits a weight in one stream per column group.
 *   S[g][k/32][2][NC] fp16: d, then m (asymmetric); S[g][k/32][NC]: d (symmetric)
 * A pair's two values are shifted to bits 0..4 of each 16-bit half (none for the first of a word) and masked
 * over bf16 exponent 128 by one vpternlogd, so each half reads 128 + q exactly (a 7-bit mantissa holds q):
 * a vdpbf16ps operand, five instructions for three pairs. x is rounded to bf16 as for the int4 kernel, and
 * per group S = sum x (128 + q) gives sum x w = d * S + (m - 128 d) * X, X = sum x over the group (symmetric:
 * d * S - 144 d * X). 32 k are 16 pairs, so groups realign with words every 96 k: a k block starts at a
 * multiple of 96. Per group the partial S starts from zero and folds into fp32 sums; an output's arithmetic
 * does not depend on M or on the tile shape (a lone row takes two column groups at once), so a row's result
 * does not depend on its batch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_grid.h"

#define I5G 32

/* q [N, K] uint8, bit 4 -> h [groups][K/32][NC] uint32: of group k0 = 32 b, k = k0 + 8 o + 2 j + h (o, j < 4,
 * h < 2) is bit 16 h + 4 o + j (gemm_kq.c's third bit of Q3_K) */
int ridgeline_pack_i5_high(const uint8_t *q, uint32_t *h, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC, B = K / I5G;
    if (K % I5G) return -1;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                uint32_t word = 0;
                for (int r = 0; n < N && r < I5G; r++) {
                    const int o = r / 8, j = (r % 8) / 2, half = r % 2;
                    word |= (uint32_t)((q[n * K + b * I5G + r] >> 4) & 1) << (16 * half + 4 * o + j);
                }
                h[(g * B + b) * QT_NC + c] = word;
            }
    return 0;
}

/* q [N, K] uint8 in [0, 31] -> p [groups][ceil(K/6)][NC] uint32, three k pairs a word (above) */
int ridgeline_pack_i5(const uint8_t *q, uint32_t *p, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC, W = (K + 5) / 6;
    if (K % I5G) return -1;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t w = 0; w < W; w++)
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                uint32_t word = 0;
                for (int j = 0; n < N && j < 3 && 6 * w + 2 * j < K; j++) {
                    const uint8_t *src = q + n * K + 6 * w + 2 * j;
                    word |= (uint32_t)(src[0] & 31) << (5 * j) | (uint32_t)(src[1] & 31) << (5 * j + 16);
                }
                p[(g * W + w) * QT_NC + c] = word;
            }
    return 0;
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define I5_MR 4

/* group PH (0..2) of the 96 k at unit wu: its 16 pairs (pair p = 16 PH + i is word p / 3's slot p % 3) into S,
 * then S folded into acc with the group's scales (group b + PH of the call's K) */
#define I5_GROUP(PH) \
    { \
        const int64_t bg = b + (PH); \
        __m512 S[I5_MR][2 * QT_NR]; \
        __m512i W[2 * QT_NR]; \
        for (int i = 0; i < mr; i++) \
            for (int v = 0; v < nv; v++) S[i][v] = _mm512_setzero_ps(); \
        _Pragma("GCC unroll 16") for (int e = 0; e < 16; e++) { \
            const int pr = 16 * (PH) + e, w = pr / 3, j = pr % 3; \
            if (e == 0 || j == 0) { \
                if (j == 0) \
                    for (int c = 0; c < ng; c++) w_prefetch(wu + c * gs + w * QT_NC, QT_NR, mr); \
                for (int v = 0; v < nv; v++) \
                    W[v] = _mm512_loadu_si512(wu + (v / QT_NR) * gs + w * QT_NC + 16 * (v % QT_NR)); \
            } \
            __m512bh xp[I5_MR]; \
            for (int i = 0; i < mr; i++) { \
                int32_t pair; \
                memcpy(&pair, xb + i * ldx + (bg - b0) * I5G + 2 * e, 4); \
                xp[i] = (__m512bh)_mm512_set1_epi32(pair); \
            } \
            for (int v = 0; v < nv; v++) { \
                const __m512i t = j ? _mm512_srli_epi32(W[v], 5 * j) : W[v]; \
                const __m512bh wq = (__m512bh)_mm512_ternarylogic_epi32(t, five, magic, 0xEA); /* (t & 31) | 128 */ \
                for (int i = 0; i < mr; i++) S[i][v] = _mm512_dpbf16_ps(S[i][v], xp[i], wq); \
            } \
        } \
        for (int v = 0; v < nv; v++) { \
            __m512 d, m; \
            if (sym == 2) { \
                grid_kscales((const uint8_t *)sc + (v / QT_NR) * ss + bg * 2 * QT_NC + 16 * (v % QT_NR), \
                             dd + (v / QT_NR) * sd + bg / (256 / I5G) * 2 * QT_NC + 16 * (v % QT_NR), &d, &m); \
            } else { \
                const uint16_t *sv = sc + (v / QT_NR) * ss + bg * sn * QT_NC + 16 * (v % QT_NR); \
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sv)); \
                m = sym ? d : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sv + QT_NC))); \
            } \
            const __m512 mo = sym == 1 ? _mm512_mul_ps(d, _mm512_set1_ps(-144.f)) \
                                       : _mm512_fnmadd_ps(_mm512_set1_ps(128.f), d, m); \
            for (int i = 0; i < mr; i++) { \
                acc[i][v] = _mm512_fmadd_ps(S[i][v], d, acc[i][v]); \
                acc[i][v] = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * ldxs + bg - b0]), mo, acc[i][v]); \
            } \
        } \
    }

/* mr rows of xb (bf16, stride ldx, from group b0's first k) and their group sums xs (stride ldxs) against ng (1
 * or 2) consecutive column groups (word stride gs, scale stride ss halves; pw, sc at the call's k = 0), groups
 * [b0, b0 + kg) of K, b0 a multiple of 3 -> y rows at columns n0..
 * sym 0: fp16 d and m per 32; 1: fp16 d per 32 (symmetric); 2: Q5_K's grid: per 32 a byte scale and minimum (sc
 * [k/32][2][NC] bytes), per 256 k the fp16 D and Dmin (dd [k/256][2][NC], stride sd halves), as gemm_int4.c's
 * Q4_K mode */
static inline __attribute__((always_inline)) void
ukr_i5(const int mr, const int ng, const int sym, const uint32_t *pw, int64_t gs, const uint16_t *sc, int64_t ss,
       const uint16_t *xb, int64_t ldx, const float *xs, int64_t ldxs, float *y, int64_t n0, int64_t N, int64_t b0,
       int64_t kg, int flags, const uint16_t *dd, int64_t sd) {
    const __m512i five = _mm512_set1_epi32(0x001F001F), magic = _mm512_set1_epi32(0x43004300);
    const int nv = ng * QT_NR, sn = sym == 1 ? 1 : 2, sb = sym == 2 ? 1 : 2; /* scales per group, bytes each */
    __m512 acc[I5_MR][2 * QT_NR];
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t b = b0; b < b0 + kg; b += 3) {
        const uint32_t *wu = pw + b / 3 * 16 * QT_NC; /* the unit's 16 words */
        for (int c = 0; c < ng; c++) /* the scales' stream (the unit's 3 groups), as far ahead in k as the words' */
            w_prefetch_at((const uint8_t *)sc + (c * ss + b * sn * QT_NC) * sb, (3 * sn * QT_NC * sb + 63) / 64, mr,
                          W_PF_BYTES / 8);
        I5_GROUP(0)
        if (b + 1 < b0 + kg) I5_GROUP(1)
        if (b + 2 < b0 + kg) I5_GROUP(2)
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_i5_fn)(const uint32_t *, int64_t, const uint16_t *, int64_t, const uint16_t *, int64_t,
                          const float *, int64_t, float *, int64_t, int64_t, int64_t, int64_t, int, const uint16_t *,
                          int64_t);
#define UKR_I5(R, NG, SYM) \
    static void ukr_i5_##R##_##NG##_##SYM(const uint32_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, \
                                          const uint16_t *xb, int64_t ldx, const float *xs, int64_t ldxs, float *y, \
                                          int64_t n0, int64_t N, int64_t b0, int64_t kg, int flags, \
                                          const uint16_t *dd, int64_t sd) { \
        ukr_i5(R, NG, SYM, pw, gs, sc, ss, xb, ldx, xs, ldxs, y, n0, N, b0, kg, flags, dd, sd); \
    }
UKR_I5(1, 2, 0) UKR_I5(1, 1, 0) UKR_I5(2, 1, 0) UKR_I5(3, 1, 0) UKR_I5(4, 1, 0)
UKR_I5(1, 2, 1) UKR_I5(1, 1, 1) UKR_I5(2, 1, 1) UKR_I5(3, 1, 1) UKR_I5(4, 1, 1)
UKR_I5(1, 2, 2) UKR_I5(1, 1, 2) UKR_I5(2, 1, 2) UKR_I5(3, 1, 2) UKR_I5(4, 1, 2)
static const ukr_i5_fn UKRS_I5[3][I5_MR + 1] = {{0, ukr_i5_1_1_0, ukr_i5_2_1_0, ukr_i5_3_1_0, ukr_i5_4_1_0},
                                                {0, ukr_i5_1_1_1, ukr_i5_2_1_1, ukr_i5_3_1_1, ukr_i5_4_1_1},
                                                {0, ukr_i5_1_1_2, ukr_i5_2_1_2, ukr_i5_3_1_2, ukr_i5_4_1_2}};
static const ukr_i5_fn UKRS_I5_WIDE[3] = {ukr_i5_1_2_0, ukr_i5_1_2_1, ukr_i5_1_2_2};

typedef struct {
    const uint32_t *p;
    const uint16_t *s;
    const float *x;
    float *y;
    int64_t M, N, K;
    int sym;
} i5_args;

/* the prepared x: xb [M][K] bf16, then xs [M][K/32] fp32 */
static inline float *i5_sums(const i5_args *a, const void *ws) {
    return (float *)((uint16_t *)ws + a->M * a->K);
}

static void tile_i5(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                    int flags) {
    const i5_args *a = args;
    const int64_t KG = a->K / I5G, gs = (a->K + 5) / 6 * QT_NC, ss = KG * (a->sym == 1 ? 1 : 2) * QT_NC;
    const uint32_t *pw = a->p + g * gs;
    const uint16_t *sc = a->s + g * ss, *dd = NULL;
    int64_t sd = 0;
    if (a->sym == 2) { /* bytes: ss of them per column group; then the fp16 pairs per 256 k */
        const int64_t G = (a->N + QT_NC - 1) / QT_NC;
        sc = (const uint16_t *)((const uint8_t *)a->s + g * ss);
        sd = a->K / 256 * 2 * QT_NC;
        dd = (const uint16_t *)((const uint8_t *)a->s + G * ss) + g * sd;
    }
    const ukr_i5_fn f = ng == 2 ? UKRS_I5_WIDE[a->sym] : UKRS_I5[a->sym][mr];
    f(pw, gs, sc, ss, (const uint16_t *)ws + m * a->K + k0, a->K, i5_sums(a, ws) + m * KG + k0 / I5G, KG,
      a->y + m * a->N, g * QT_NC, a->N, k0 / I5G, kc / I5G, flags, dd, sd);
}

/* the driver's prep: rows [r0, r1) of x rounded to bf16 (nearest even), and each group's sum of them */
static void prep_i5(const void *args, void *ws, int64_t r0, int64_t r1) {
    const i5_args *a = args;
    const int64_t K = a->K;
    uint16_t *xb = (uint16_t *)ws;
    float *xs = i5_sums(a, ws);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k0 = 0; k0 < K; k0 += I5G) {
            const __m512 lo = _mm512_loadu_ps(a->x + r * K + k0), hi = _mm512_loadu_ps(a->x + r * K + k0 + 16);
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512(xb + r * K + k0, v);
            __m512 sum = _mm512_add_ps((__m512)_mm512_slli_epi32(v, 16),
                                       (__m512)_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
            xs[r * (K / I5G) + k0 / I5G] = _mm512_reduce_add_ps(sum);
        }
}
#endif

/* p: ridgeline_pack_i5's words of q; s: the scales as above */
int ridgeline_gemm_i5p(const uint32_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                       int64_t K, int sym, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1 || K % I5G) return -1;
    const int64_t KC = qt_k_block(M, K, 2, 3 * I5G);
    const i5_args a = {p, s, x, y, M, N, K, sym != 0};
    const td_plan plan = grid_plan(M, N, K, KC, I5_MR, I5G);
    return ridgeline_td_run(&plan, &a, prep_i5, tile_i5, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)sym; (void)nthreads;
    return -2;
#endif
}

/* GGUF Q5_K's grid as stored: p as ridgeline_gemm_i5p's; s: [groups][K/32][2][NC] bytes (the 6-bit scale and
 * minimum of each 32), then [groups][K/256][2][NC] fp16 (D, Dmin). K a multiple of 256. */
int ridgeline_gemm_i5k(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1 || K % 256) return -1;
    const int64_t KC = qt_k_block(M, K, 2, 3 * I5G);
    const i5_args a = {p, (const uint16_t *)s, x, y, M, N, K, 2};
    const td_plan plan = grid_plan(M, N, K, KC, I5_MR, I5G);
    return ridgeline_td_run(&plan, &a, prep_i5, tile_i5, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
