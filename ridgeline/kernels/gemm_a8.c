/* y[M, N] = x[M, K] @ W^T with x quantized to int8 on the fly and integer dot products (vpdpbusd,
 * AVX512-VNNI): W8A8 against the int8 format's weights, W4A8 against the int4 formats'.
 * Activations: every block of 32 consecutive k of a row (W8A8; the last block of a row may be
 * shorter), or every group of G consecutive k (W4A8), gets its own scale a = max|x| / 127 and
 * r = round(x / a) in [-127, 127], as llama.cpp quantizes its activations to Q8 blocks. Each row is
 * quantized alone and its integer sums are exact, and an output's floating-point steps are the same
 * whatever the tile or the number of rows, so a row's result never depends on how many rows share
 * the call.
 *
 * W8A8: w[n][k] = s[n] q[n][k], q in [-127, 127] (gemm_int8.c's values).
 *   P[g][k/4][NC][4] u8 q + 128: four consecutive k of one column in one 32-bit lane; K a multiple
 *   of 4; S[g*NC + c] fp32 scales (zero past N). vpdpbusd takes the u8 weights against s8 r; per
 *   block b, the int32 sum starts at -128 R_b (R_b = sum of the block's r, found when quantizing),
 *   so it ends at sum_b r q exactly, and y = s[n] * sum over blocks, in k order, of a_b * that sum.
 * W8A8-g32: the same u8 weights with an fp16 scale d[n][b] per block of 32 k instead of s[n] (the
 *   int8-g32 format's grid, GGUF Q8_0's; llama.cpp's Q8_0 x Q8 activations): y = sum over blocks, in
 *   k order, of (d[n][b] a_b) * the block's sum. Scales [groups][K/32][NC] fp16; K a multiple of 32.
 * W4A8: gemm_int4.c's packed nibbles and fp16 scales unchanged (d, and m when asymmetric). The
 *   nibbles are the u8 operand and r the s8 one: per group S = sum r q (int32), and
 *   y = sum over groups, in k order, of d a S + m' X, X = a sum r, m' = m or -8 d (symmetric).
 *   A nibble mask gives bytes k = 8o + {0, 4, 1, 5} of a word and a shift and mask k = 8o + {2, 6,
 *   3, 7}, so r is stored in that order within each 8 k. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_tile.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define A8_ISA 1
#else
#define A8_ISA 0
#endif
#define N_GROUPS(n) (((n) + QT_NC - 1) / QT_NC)

int ridgeline_a8_available(void) {
#if A8_ISA
    return 1;
#else
    return 0;
#endif
}

/* q [N, K] int8 -> p [groups][K/4][NC][4] u8 (q + 128, 128 past N); K a multiple of 4 */
int ridgeline_pack_w8a8(const int8_t *q, uint8_t *p, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC;
    if (K % 4) return -1;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t k = 0; k < K; k++)
            for (int64_t col = 0; col < QT_NC; col++) {
                const int64_t n = g * QT_NC + col;
                p[((g * K / 4 + k / 4) * QT_NC + col) * 4 + k % 4] = (uint8_t)((n < N ? q[n * K + k] : 0) + 128);
            }
    return 0;
}

#if A8_ISA
#define W8_MR 4
#define A8_B 32 /* W8A8: k per activation block */
#define A8_BLOCKS(K) (((K) + A8_B - 1) / A8_B)
#define W4_MR 4

static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* max |x[0..n)| */
static inline float absmax(const float *x, int64_t n) {
    __m512 m = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 msk = n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(msk, x + k)));
    }
    return _mm512_reduce_max_ps(m);
}

/* one row of K in blocks of A8_B (the last one shorter when A8_B does not divide K) -> s8 r in k
 * order, per block a = max|x| / 127 and the int32 -128 * sum r (its bits in a float slot) (W8A8) */
static void quant_row_blocks(const float *x, int8_t *r, float *ax, int64_t K) {
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += A8_B, b++) {
        const int64_t n = K - k0 < A8_B ? K - k0 : A8_B;
        const float mx = absmax(x + k0, n);
        const __m512 inv = _mm512_set1_ps(mx > 0 ? 127.f / mx : 0.f);
        __m512i sum = _mm512_setzero_si512();
        for (int64_t k = 0; k < n; k += 16) {
            const __mmask16 msk = n - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - k)) - 1);
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(msk, x + k0 + k), inv));
            sum = _mm512_add_epi32(sum, q);
            _mm_mask_storeu_epi8(r + k0 + k, msk, _mm512_cvtepi32_epi8(q));
        }
        const int32_t c = -128 * _mm512_reduce_add_epi32(sum);
        ax[2 * b] = mx / 127.f;
        memcpy(ax + 2 * b + 1, &c, 4);
    }
}

/* one row of K in groups of G -> s8 r (each 8 k in nibble order), per group a and X = a * sum r (W4A8) */
static void quant_row_groups(const float *x, int8_t *r, float *ax, int64_t K, int64_t G) {
    const __m128i perm = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += G, b++) {
        const float mx = absmax(x + k0, G);
        const __m512 inv = _mm512_set1_ps(mx > 0 ? 127.f / mx : 0.f);
        __m512i sum = _mm512_setzero_si512();
        for (int64_t k = k0; k < k0 + G; k += 16) {
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128((__m128i *)(r + k), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(q), perm));
        }
        ax[2 * b] = mx / 127.f;
        ax[2 * b + 1] = ax[2 * b] * (float)_mm512_reduce_add_epi32(sum);
    }
}

/* mr rows of s8 xq (stride ldx) with per-block (a, -128 R) pairs xs (stride ldxs) against ng (1 or
 * 2) consecutive column groups (pw [K/4][NC][4] u8, group stride gs bytes; scales s: fp32 [NC] per
 * group, or (g32) fp16 [K/32][NC], group stride ss elements) -> y rows at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_w8(const int mr, const int ng, const int g32, const uint8_t *pw, int64_t gs, const void *s, int64_t ss,
       const int8_t *xq, int64_t ldx, const float *xs, int64_t ldxs, float *y, int64_t n0, int64_t N, int64_t K) {
    const int nv = ng * QT_NR;
    __m512 acc[W8_MR][2 * QT_NR];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += A8_B, b++) {
        const int64_t k4e = (K - k0 < A8_B ? K : k0 + A8_B) / 4;
        __m512i S[W8_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++) {
            int32_t c;
            memcpy(&c, xs + i * ldxs + 2 * b + 1, 4);
            for (int v = 0; v < nv; v++) S[i][v] = _mm512_set1_epi32(c);
        }
        for (int64_t k4 = k0 / 4; k4 < k4e; k4++) {
            for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + k4 * QT_NC * 4, QT_NR, mr);
            for (int v = 0; v < nv; v++) {
                const __m512i w = _mm512_loadu_si512(pw + (v / QT_NR) * gs + (k4 * QT_NC + 16 * (v % QT_NR)) * 4);
                for (int i = 0; i < mr; i++)
                    S[i][v] = _mm512_dpbusd_epi32(S[i][v], w, _mm512_set1_epi32(load4(xq + i * ldx + 4 * k4)));
            }
        }
        if (g32) {
            for (int v = 0; v < nv; v++) {
                const uint16_t *sv = (const uint16_t *)s + (v / QT_NR) * ss + b * QT_NC + 16 * (v % QT_NR);
                const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sv));
                for (int i = 0; i < mr; i++)
                    acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i][v]),
                                                _mm512_mul_ps(d, _mm512_set1_ps(xs[i * ldxs + 2 * b])), acc[i][v]);
            }
            continue;
        }
        for (int i = 0; i < mr; i++) {
            const __m512 a = _mm512_set1_ps(xs[i * ldxs + 2 * b]);
            for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i][v]), a, acc[i][v]);
        }
    }
    for (int v = 0; !g32 && v < nv; v++) { /* the second group's scales follow the first's */
        const __m512 sv = _mm512_loadu_ps((const float *)s + 16 * v);
        for (int i = 0; i < mr; i++) acc[i][v] = _mm512_mul_ps(acc[i][v], sv);
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

/* mr rows of s8 xq (stride ldx) with per-group (a, X) pairs xs (stride ldxs) against ng column
 * groups of nibbles (pw [K/8][NC] words, group stride gs words; fp16 scales sc [KG][sn][NC], group
 * stride ss halves) -> y rows at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_w4(const int mr, const int ng, const int sym, const uint32_t *pw, int64_t gs, const uint16_t *sc, int64_t ss,
       const int8_t *xq, int64_t ldx, const float *xs, int64_t ldxs, float *y, int64_t n0, int64_t N, int64_t KG,
       int64_t G) {
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    const int nv = ng * QT_NR, sn = sym ? 1 : 2;
    __m512 acc[W4_MR][2 * QT_NR];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
    for (int64_t b = 0; b < KG; b++) {
        __m512i S[W4_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) S[i][v] = _mm512_setzero_si512();
        for (int64_t o = 0; o < G / 8; o++) {
            for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + (b * (G / 8) + o) * QT_NC, QT_NR, mr);
            for (int v = 0; v < nv; v++) {
                const __m512i w = _mm512_loadu_si512(pw + (v / QT_NR) * gs + (b * (G / 8) + o) * QT_NC +
                                                     16 * (v % QT_NR));
                const __m512i lo = _mm512_and_si512(w, lo4), hi = _mm512_and_si512(_mm512_srli_epi32(w, 4), lo4);
                for (int i = 0; i < mr; i++) {
                    const int8_t *xr = xq + i * ldx + b * G + 8 * o;
                    S[i][v] = _mm512_dpbusd_epi32(S[i][v], lo, _mm512_set1_epi32(load4(xr)));
                    S[i][v] = _mm512_dpbusd_epi32(S[i][v], hi, _mm512_set1_epi32(load4(xr + 4)));
                }
            }
        }
        for (int v = 0; v < nv; v++) {
            const uint16_t *sv = sc + (v / QT_NR) * ss + b * sn * QT_NC + 16 * (v % QT_NR);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sv));
            const __m512 mo = sym ? _mm512_mul_ps(d, _mm512_set1_ps(-8.f))
                                  : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sv + QT_NC)));
            for (int i = 0; i < mr; i++) {
                const __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(xs[i * ldxs + 2 * b]));
                acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i][v]), t, acc[i][v]);
                acc[i][v] = _mm512_fmadd_ps(mo, _mm512_set1_ps(xs[i * ldxs + 2 * b + 1]), acc[i][v]);
            }
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_w8_fn)(const uint8_t *, int64_t, const void *, int64_t, const int8_t *, int64_t, const float *,
                          int64_t, float *, int64_t, int64_t, int64_t);
#define UKR_W8(R, NG, G32) \
    static void ukr_w8_##R##_##NG##_##G32(const uint8_t *pw, int64_t gs, const void *s, int64_t ss, \
                                          const int8_t *xq, int64_t ldx, const float *xs, int64_t ldxs, float *y, \
                                          int64_t n0, int64_t N, int64_t K) { \
        ukr_w8(R, NG, G32, pw, gs, s, ss, xq, ldx, xs, ldxs, y, n0, N, K); \
    }
UKR_W8(1, 2, 0) UKR_W8(1, 1, 0) UKR_W8(2, 1, 0) UKR_W8(3, 1, 0) UKR_W8(4, 1, 0)
UKR_W8(1, 2, 1) UKR_W8(1, 1, 1) UKR_W8(2, 1, 1) UKR_W8(3, 1, 1) UKR_W8(4, 1, 1)
static const ukr_w8_fn UKRS_W8[2][W8_MR + 1] = {{0, ukr_w8_1_1_0, ukr_w8_2_1_0, ukr_w8_3_1_0, ukr_w8_4_1_0},
                                                {0, ukr_w8_1_1_1, ukr_w8_2_1_1, ukr_w8_3_1_1, ukr_w8_4_1_1}};
static const ukr_w8_fn UKRS_W8_WIDE[2] = {ukr_w8_1_2_0, ukr_w8_1_2_1};

typedef void (*ukr_w4_fn)(const uint32_t *, int64_t, const uint16_t *, int64_t, const int8_t *, int64_t,
                          const float *, int64_t, float *, int64_t, int64_t, int64_t, int64_t);
#define UKR_W4(R, NG, SYM) \
    static void ukr_w4_##R##_##NG##_##SYM(const uint32_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, \
                                          const int8_t *xq, int64_t ldx, const float *xs, int64_t ldxs, float *y, \
                                          int64_t n0, int64_t N, int64_t KG, int64_t G) { \
        ukr_w4(R, NG, SYM, pw, gs, sc, ss, xq, ldx, xs, ldxs, y, n0, N, KG, G); \
    }
UKR_W4(1, 2, 0) UKR_W4(1, 1, 0) UKR_W4(2, 1, 0) UKR_W4(3, 1, 0) UKR_W4(4, 1, 0)
UKR_W4(1, 2, 1) UKR_W4(1, 1, 1) UKR_W4(2, 1, 1) UKR_W4(3, 1, 1) UKR_W4(4, 1, 1)
static const ukr_w4_fn UKRS_W4[2][W4_MR + 1] = {{0, ukr_w4_1_1_0, ukr_w4_2_1_0, ukr_w4_3_1_0, ukr_w4_4_1_0},
                                                {0, ukr_w4_1_1_1, ukr_w4_2_1_1, ukr_w4_3_1_1, ukr_w4_4_1_1}};
static const ukr_w4_fn UKRS_W4_WIDE[2] = {ukr_w4_1_2_0, ukr_w4_1_2_1};

typedef struct {
    const void *p, *s; /* packed weights, scales */
    const float *x;
    float *y;
    int64_t M, N, K, G; /* G: 0 for W8A8 */
    int sym;            /* W4A8: symmetric; W8A8: fp16 scales per block of 32 (g32) */
} a8_args;

/* the prepared x: xq [M][K] s8 r, then at the next 64 bytes xs [M][blocks or groups][2]: per block
 * (W8A8) or group (W4A8) of each row (a, -128 R) or (a, X) */
static inline int64_t a8_xs_row(const a8_args *a) { return 2 * (a->G ? a->K / a->G : A8_BLOCKS(a->K)); }
static inline size_t a8_xs_offset(const a8_args *a) { return ((size_t)(a->M * a->K) + 63) & ~(size_t)63; }
static inline const float *a8_xs(const a8_args *a, const void *ws) {
    return (const float *)((const uint8_t *)ws + a8_xs_offset(a));
}

/* the driver's prep: rows [r0, r1) of x quantized to int8 */
static void prep_a8(const void *args, void *ws, int64_t r0, int64_t r1) {
    const a8_args *a = args;
    const int64_t K = a->K, xs_row = a8_xs_row(a);
    float *xs = (float *)a8_xs(a, ws);
    for (int64_t m = r0; m < r1; m++) {
        if (a->G)
            quant_row_groups(a->x + m * K, (int8_t *)ws + m * K, xs + m * xs_row, K, a->G);
        else
            quant_row_blocks(a->x + m * K, (int8_t *)ws + m * K, xs + m * xs_row, K);
    }
}

/* the driver's tile: rows [m, m + mr), column groups [g, g + ng), all of k */
static void tile_a8(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                    int flags) {
    const a8_args *a = args;
    const int64_t N = a->N, K = a->K, nb = a8_xs_row(a);
    const int8_t *xq = (const int8_t *)ws + m * K;
    const float *xs = a8_xs(a, ws) + m * nb;
    (void)k0; (void)kc; (void)flags;
    if (!a->G) {
        const int64_t ss = a->sym ? K / A8_B * QT_NC : QT_NC;
        const ukr_w8_fn f = ng == 2 ? UKRS_W8_WIDE[a->sym] : UKRS_W8[a->sym][mr];
        const void *s = a->sym ? (const void *)((const uint16_t *)a->s + g * ss) : (const void *)((const float *)a->s + g * ss);
        f((const uint8_t *)a->p + g * K * QT_NC, K * QT_NC, s, ss, xq, K, xs, nb, a->y + m * N, g * QT_NC, N, K);
        return;
    }
    const int64_t KG = K / a->G, gs = K / 8 * QT_NC, ss = KG * (a->sym ? 1 : 2) * QT_NC;
    const ukr_w4_fn f = ng == 2 ? UKRS_W4_WIDE[a->sym] : UKRS_W4[a->sym][mr];
    f((const uint32_t *)a->p + g * gs, gs, (const uint16_t *)a->s + g * ss, ss, xq, K, xs, nb, a->y + m * N, g * QT_NC,
      N, KG, a->G);
}

static int gemm_a8(const a8_args *a, int nthreads) {
    const int mr = a->G ? W4_MR : W8_MR;
    const td_plan plan = {.M = a->M, .groups = N_GROUPS(a->N), .K = a->K, .KC = a->K,
                          .rows = qt_chunk_rows(a->K, 1, mr), .mr = mr, .wide = 1,
                          .ws_bytes = a8_xs_offset(a) + (size_t)(a->M * a8_xs_row(a)) * sizeof(float),
                          .own_rows = TD_OWN_ROWS, .cols = QT_NC};
    return ridgeline_td_run(&plan, a, prep_a8, tile_a8, nthreads);
}
#endif

/* p from ridgeline_pack_w8a8; s the int8 format's scales, zero-padded to whole column groups */
int ridgeline_gemm_w8a8(const uint8_t *p, const float *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                        int nthreads) {
#if A8_ISA
    if (M < 1 || N < 1 || K < 1 || K % 4) return -1;
    const a8_args a = {p, s, x, y, M, N, K, 0, 0};
    return gemm_a8(&a, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}

/* p, s: ridgeline_pack_i4's packed nibbles and the int4 format's scale layout (gemm_int4.c) */
int ridgeline_gemm_w4a8(const uint32_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                        int64_t K, int64_t G, int sym, int nthreads) {
#if A8_ISA
    if (M < 1 || N < 1 || K < 1 || (G != 32 && G != 64 && G != 128) || K % G) return -1;
    const a8_args a = {p, s, x, y, M, N, K, G, sym != 0};
    return gemm_a8(&a, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)G; (void)sym; (void)nthreads;
    return -2;
#endif
}

/* p from ridgeline_pack_w8a8; s fp16 [groups][K/32][NC] (the int8-g32 format's scales) */
int ridgeline_gemm_w8a8_g32(const uint8_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                            int64_t K, int nthreads) {
#if A8_ISA
    if (M < 1 || N < 1 || K < 1 || K % A8_B) return -1;
    const a8_args a = {p, s, x, y, M, N, K, 0, 1};
    return gemm_a8(&a, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
