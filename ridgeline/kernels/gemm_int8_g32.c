/* y[M, N] = x[M, K] @ W^T for int8 weights with one fp16 scale per group of 32 consecutive k of an
 * output channel (GGUF Q8_0's grid), fp32 x and y (weight-only: x is not quantized).
 * w[n][k] = d[n][k / 32] * q[n][k], q in [-127, 127]; K a multiple of 32.
 *   P   int8 in gemm_int8.c's layout (ridgeline_pack_i8_gemm): with AVX512-BF16 k pairs
 *       [g][K/2][NC][2] for bf16 dot products on x rounded to bf16 (as gemm_int8.c), else [g][k][NC]
 *       with fp32 FMAs; zero-padded past N
 *   S[g][k/32][NC]   fp16, zero-padded past N
 * The group's weights are converted in registers once and shared by the tile's rows; per
 * quantization group a partial sum T = sum q x over its 32 k (in k order) starts from zero and
 * folds into the output as acc += d * T (one FMA). Tiles are MR rows x one column group, or for one
 * row two column groups; an output's arithmetic is the same in either and whatever M is (k blocks
 * are whole quantization groups, continued from y), so a row's result never depends on the batch
 * it shares. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "int8_step.h"
#include "quant_tile.h"

#define I8G 32

#ifdef __AVX512F__
#define I8G_MR 4

/* mr rows of x (stride ldx) against ng (1 or 2) column groups (stride gs bytes, scale stride ss
 * halves), kg quantization groups from this block's start -> y rows at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_i8g(const int mr, const int ng, const int8_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, const i8_x *x,
        int64_t ldx, float *y, int64_t n0, int64_t N, int64_t kg, int flags) {
    __m512 acc[I8G_MR][2 * QT_NR];
    const int nv = ng * QT_NR;
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t b = 0; b < kg; b++) {
        __m512 T[I8G_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) T[i][v] = _mm512_setzero_ps();
        for (int64_t k = b * I8G; k < (b + 1) * I8G; k += I8_STEP) i8_step(mr, ng, pw, gs, x, ldx, k, &T[0][0], 2 * QT_NR);
        for (int v = 0; v < nv; v++) {
            const uint16_t *sv = sc + (v / QT_NR) * ss + b * QT_NC + 16 * (v % QT_NR);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sv));
            for (int i = 0; i < mr; i++) acc[i][v] = _mm512_fmadd_ps(T[i][v], d, acc[i][v]);
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_i8g_fn)(const int8_t *, int64_t, const uint16_t *, int64_t, const i8_x *, int64_t, float *,
                           int64_t, int64_t, int64_t, int);
#define UKR_I8G(R, NG) \
    static void ukr_i8g_##R##_##NG(const int8_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, const i8_x *x, \
                                   int64_t ldx, float *y, int64_t n0, int64_t N, int64_t kg, int flags) { \
        ukr_i8g(R, NG, pw, gs, sc, ss, x, ldx, y, n0, N, kg, flags); \
    }
UKR_I8G(1, 2) UKR_I8G(1, 1) UKR_I8G(2, 1) UKR_I8G(3, 1) UKR_I8G(4, 1)
static const ukr_i8g_fn UKRS_I8G[I8G_MR + 1] = {0, ukr_i8g_1_1, ukr_i8g_2_1, ukr_i8g_3_1, ukr_i8g_4_1};

/* the driver's tile: rows [m, m + mr), column groups [g, g + ng), k in [k0, k0 + kc) (whole
 * quantization groups) */
static void tile_i8g(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                     int flags) {
    const i8_args *a = args;
    const int64_t gs = a->K2 * QT_NC, ss = a->K2 / I8G * QT_NC;
    const int8_t *pw = a->p + g * gs + k0 * QT_NC;
    const uint16_t *sc = (const uint16_t *)a->s + g * ss + k0 / I8G * QT_NC;
    const ukr_i8g_fn f = ng == 2 ? ukr_i8g_1_2 : UKRS_I8G[mr];
    f(pw, gs, sc, ss, i8_x_at(a, ws, m, k0), a->K2, a->y + m * a->N, g * QT_NC, a->N, kc / I8G, flags);
}
#endif

int ridgeline_gemm_i8g32(const int8_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                         int64_t K, int nthreads) {
#ifdef __AVX512F__
    if (M < 1 || N < 1 || K < 1 || K % I8G) return -1;
    const int64_t G = (N + QT_NC - 1) / QT_NC, KC = qt_k_block(M, K, sizeof(i8_x), I8G);
    const i8_args a = {p, s, x, y, N, K, K};
    const td_plan plan = {.M = M, .groups = G, .K = K, .KC = KC, .rows = qt_chunk_rows(KC, sizeof(i8_x), I8G_MR),
                          .mr = I8G_MR, .wide = 1, .ws_bytes = i8_x_bytes(M, K), .own_rows = TD_OWN_ROWS,
                          .cols = QT_NC};
    return ridgeline_td_run(&plan, &a, I8_PREP, tile_i8g, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
