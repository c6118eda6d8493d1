/* y[M, N] = x[M, K] @ W^T for fp8 weights, fp32 x and y (weight-only: x is not quantized; the fp8
 * values are emulated, converted to fp32 in registers). Modes:
 *   FP8_E4M3, FP8_E5M2  one fp32 scale per output channel (a per-tensor scale is that value repeated):
 *                       w[n][k] = s[n] q[n][k]
 *   FP8_MX              MXFP8: E4M3 q, blocks of 32 consecutive k share 2^(e - 127), e one E8M0 byte
 *   P[g][k][NC] fp8 bytes (gemm_int8.c's layout, zero past N)
 *   S: per channel [g * NC] fp32, the E4M3 ones times 256 (see below); MX [g][K/32][NC] E8M0 bytes
 * Conversion: an fp8 byte shifted to the top of a 16-bit lane is an fp16 number: E5M2 exactly; E4M3
 * sign-extended to 16 bits and shifted left by 7 (the sign in bit 15, and in bit 14, which is then
 * cleared) reads the E4M3 value times 2^-8, subnormals included (vcvtph2ps converts fp16 subnormals
 * exactly).
 * Per k, each group's 48 weights are converted once and shared by the tile's rows, whose FMAs sum
 * q x over k in order; the per-channel scale multiplies once, at the end, while MX multiplies each
 * converted weight by its block's power of two first (exact: the products are the MXFP8 values). An output's arithmetic is the same whatever the tile or M, so a row's result
 * does not depend on the batch it shares. */
#include <stdint.h>
#include <stdlib.h>

#include "quant_tile.h"

enum { FP8_E4M3 = 0, FP8_E5M2 = 1, FP8_MX = 2 };
#define FP8_BLOCK 32

int ridgeline_fp8_available(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define FP8_MR 8 /* rows per tile */

static inline __attribute__((always_inline)) __m512 fp8_to_ps(const uint8_t *src, const int e5m2) {
    const __m128i b = _mm_loadu_si128((const __m128i *)src);
    if (e5m2) return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
    /* sign-extended and shifted by 7: the sign lands in bits 15 and 14; bit 14 cleared */
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                            _mm256_set1_epi16((short)0xBFFF)));
}

/* 16 E8M0 bytes -> 2^(e - 127) * 256 (the E4M3 conversion's 2^-8 undone) */
static inline __m512 e8m0_to_ps(const uint8_t *src) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(e, 23)), _mm512_set1_ps(256.f));
}

/* mr rows of x (stride ldx) against ng (1 or 2) consecutive groups pw [K][NC] (group stride gs
 * bytes; MX scales sc [K/32][NC], group stride ss bytes) -> y rows at columns n0..; k in [0, kc) */
static inline __attribute__((always_inline)) void
ukr_fp8(const int mode, const int mr, const int ng, const uint8_t *pw, int64_t gs, const void *s, int64_t ss,
        const float *x, int64_t ldx, float *y, int64_t n0, int64_t N, int64_t kc, int flags) {
    __m512 acc[FP8_MR][2 * QT_NR];
    const int nv = ng * QT_NR, e5m2 = mode == FP8_E5M2;
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    const int64_t bk = mode == FP8_MX ? FP8_BLOCK : kc;
    for (int64_t k0 = 0; k0 < kc; k0 += bk) {
        __m512 d[2 * QT_NR];
        if (mode == FP8_MX)
            for (int v = 0; v < nv; v++)
                d[v] = e8m0_to_ps((const uint8_t *)s + (v / QT_NR) * ss + k0 / FP8_BLOCK * QT_NC + 16 * (v % QT_NR));
        for (int64_t k = k0; k < k0 + bk; k++) {
            __m512 wv[2 * QT_NR];
            for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + k * QT_NC, 1, mr); /* 48 bytes per k */
            for (int v = 0; v < nv; v++) {
                wv[v] = fp8_to_ps(pw + (v / QT_NR) * gs + k * QT_NC + 16 * (v % QT_NR), e5m2);
                if (mode == FP8_MX) wv[v] = _mm512_mul_ps(wv[v], d[v]); /* exact: q 4 bits times 2^n */
            }
            for (int i = 0; i < mr; i++) {
                const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
                for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(xb, wv[v], acc[i][v]);
            }
        }
    }
    if (mode != FP8_MX && (flags & TD_LAST))
        for (int v = 0; v < nv; v++) {
            const __m512 sv = _mm512_loadu_ps((const float *)s + 16 * v);
            for (int i = 0; i < mr; i++) acc[i][v] = _mm512_mul_ps(acc[i][v], sv);
        }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_fp8_fn)(const uint8_t *, int64_t, const void *, int64_t, const float *, int64_t, float *, int64_t,
                           int64_t, int64_t, int);
#define UKR_FP8(MODE, R, NG) \
    static void ukr_fp8_##MODE##_##R##_##NG(const uint8_t *pw, int64_t gs, const void *s, int64_t ss, \
                                            const float *x, int64_t ldx, float *y, int64_t n0, int64_t N, \
                                            int64_t kc, int flags) { \
        ukr_fp8(MODE, R, NG, pw, gs, s, ss, x, ldx, y, n0, N, kc, flags); \
    }
#define UKR_FP8_CH(MODE) \
    UKR_FP8(MODE, 1, 2) UKR_FP8(MODE, 1, 1) UKR_FP8(MODE, 2, 1) UKR_FP8(MODE, 3, 1) UKR_FP8(MODE, 4, 1) \
    UKR_FP8(MODE, 5, 1) UKR_FP8(MODE, 6, 1) UKR_FP8(MODE, 7, 1) UKR_FP8(MODE, 8, 1)
UKR_FP8_CH(0) UKR_FP8_CH(1) UKR_FP8_CH(2)
static const ukr_fp8_fn UKRS_FP8[3][FP8_MR + 1] = {
    {0, ukr_fp8_0_1_1, ukr_fp8_0_2_1, ukr_fp8_0_3_1, ukr_fp8_0_4_1, ukr_fp8_0_5_1, ukr_fp8_0_6_1, ukr_fp8_0_7_1,
     ukr_fp8_0_8_1},
    {0, ukr_fp8_1_1_1, ukr_fp8_1_2_1, ukr_fp8_1_3_1, ukr_fp8_1_4_1, ukr_fp8_1_5_1, ukr_fp8_1_6_1, ukr_fp8_1_7_1,
     ukr_fp8_1_8_1},
    {0, ukr_fp8_2_1_1, ukr_fp8_2_2_1, ukr_fp8_2_3_1, ukr_fp8_2_4_1, ukr_fp8_2_5_1, ukr_fp8_2_6_1, ukr_fp8_2_7_1,
     ukr_fp8_2_8_1}};
static const ukr_fp8_fn UKRS_FP8_WIDE[3] = {ukr_fp8_0_1_2, ukr_fp8_1_1_2, ukr_fp8_2_1_2};

typedef struct {
    const uint8_t *p;
    const void *s;
    const float *x;
    float *y;
    int64_t N, K;
    int mode;
} fp8_args;

/* the driver's tile: rows [m, m + mr), groups [g, g + ng), k in [k0, k0 + kc) (whole blocks for MX) */
static void tile_fp8(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                     int flags) {
    const fp8_args *a = args;
    (void)ws;
    const int64_t KB = a->K / FP8_BLOCK;
    const uint8_t *pw = a->p + (g * a->K + k0) * QT_NC;
    const void *s = a->mode == FP8_MX ? (const void *)((const uint8_t *)a->s + (g * KB + k0 / FP8_BLOCK) * QT_NC)
                                      : (const void *)((const float *)a->s + g * QT_NC);
    const ukr_fp8_fn f = ng == 2 ? UKRS_FP8_WIDE[a->mode] : UKRS_FP8[a->mode][mr];
    f(pw, a->K * QT_NC, s, KB * QT_NC, a->x + m * a->K + k0, a->K, a->y + m * a->N, g * QT_NC, a->N, kc, flags);
}
#endif

/* p: ridgeline_pack_i8's layout of the fp8 bytes; s as above; mode: FP8_E4M3, FP8_E5M2, FP8_MX */
int ridgeline_gemm_fp8(const uint8_t *p, const void *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int mode, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (M < 1 || N < 1 || K < 1 || mode < 0 || mode > FP8_MX || (mode == FP8_MX && K % FP8_BLOCK)) return -1;
    const int64_t KC = qt_k_block(M, K, 4, mode == FP8_MX ? FP8_BLOCK : 1);
    const fp8_args a = {p, s, x, y, N, K, mode};
    const td_plan plan = {.M = M, .groups = (N + QT_NC - 1) / QT_NC, .K = K, .KC = KC,
                          .rows = qt_chunk_rows(KC, 4, FP8_MR), .mr = FP8_MR, .wide = 1, .cols = QT_NC};
    return ridgeline_td_run(&plan, &a, NULL, tile_fp8, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)mode; (void)nthreads;
    return -2;
#endif
}
