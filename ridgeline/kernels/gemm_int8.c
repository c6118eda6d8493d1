/* y[M, N] = x[M, K] @ W^T for int8 weights with one fp32 scale per output channel, fp32 x and y
 * (weight-only: x is not quantized). w[n][k] = s[n] * q[n][k], q in [-127, 127].
 * With AVX512-BF16 (ridgeline_pack_i8_gemm picks the layout):
 *   P[g][K2/2][NC][2] int8, NC = 48 output columns per group g, K2 = K rounded up to even: a
 *   column's q for k = 2o, 2o + 1 side by side; zero past N and at the pad k
 *   x is rounded to bf16 (as the bf16 and int4 kernels do); per k pair a vector's 32 weights are
 *   sign-extended, converted to fp32 and packed into bf16 pairs (exact: |q| <= 127) once, shared by
 *   the tile's rows, and vdpbf16ps sums q * x over k in order. Prefill and batches run at close to
 *   the bf16 kernel's rate (the fp32 FMAs below ran at 0.56x of it).
 * Without it: P[g][k][NC] (ridgeline_pack_i8), x fp32, per k the 48 weights sign-extended and
 *   converted to fp32 (vpmovsxbd + vcvtdq2ps) once, FMAs summing q * x over k in order.
 * s[g * NC + c] fp32, zero-padded past N, multiplies each output once, after the last k.
 * Tiles are MR rows x one group, or for a single row two groups (six independent chains instead of
 * three, to cover the latency when nothing else is in flight); an output's arithmetic is the same in
 * either, and whatever M is, so a row's result does not depend on the batch it shares. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "int8_step.h"
#include "quant_tile.h"

int ridgeline_int8_available(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* q [N, K] -> p [groups][K][NC] */
int ridgeline_pack_i8(const int8_t *q, int8_t *p, int64_t N, int64_t K) {
    const int64_t G = (N + QT_NC - 1) / QT_NC;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t k = 0; k < K; k++) {
            int8_t *dst = p + (g * K + k) * QT_NC;
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                dst[c] = n < N ? q[n * K + k] : 0;
            }
        }
    return 0;
}

/* 1 if ridgeline_gemm_i8p rounds x to bf16 (bf16 dot products), 0 if it multiplies in fp32 */
int ridgeline_int8_bf16(void) { return I8_BF16; }

/* the layout ridgeline_gemm_i8p reads: with AVX512-BF16, P[g][K2/2][NC][2] (K2 = K rounded up to
 * even, the pad k zero): column c's q for k = 2o, 2o + 1 side by side; else ridgeline_pack_i8's */
int ridgeline_pack_i8_gemm(const int8_t *q, int8_t *p, int64_t N, int64_t K) {
#if I8_BF16
    const int64_t G = (N + QT_NC - 1) / QT_NC, K2 = K + (K & 1);
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t k = 0; k < K2; k++) {
            int8_t *dst = p + (g * K2 + k / 2 * 2) * QT_NC + k % 2;
            for (int64_t c = 0; c < QT_NC; c++) {
                const int64_t n = g * QT_NC + c;
                dst[2 * c] = n < N && k < K ? q[n * K + k] : 0;
            }
        }
    return 0;
#else
    return ridgeline_pack_i8(q, p, N, K);
#endif
}

#ifdef __AVX512F__
#define I8_MR 8
/* mr rows of x (stride ldx) against ng (1 or 2) consecutive groups pw (group stride gs) -> y rows
 * at columns n0..; k in [0, kc) of this block (kc a multiple of I8_STEP) */
static inline __attribute__((always_inline)) void
ukr_i8(const int mr, const int ng, const int8_t *pw, int64_t gs, const float *s, const i8_x *x, int64_t ldx,
       float *y, int64_t n0, int64_t N, int64_t kc, int flags) {
    __m512 acc[I8_MR][2 * QT_NR];
    const int nv = ng * QT_NR;
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t k = 0; k < kc; k += I8_STEP) i8_step(mr, ng, pw, gs, x, ldx, k, &acc[0][0], 2 * QT_NR);
    if (flags & TD_LAST)
        for (int v = 0; v < nv; v++) {
            const __m512 sv = _mm512_loadu_ps(s + 16 * v);
            for (int i = 0; i < mr; i++) acc[i][v] = _mm512_mul_ps(acc[i][v], sv);
        }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

#define UKR_I8(R, NG) \
    static void ukr_i8_##R##_##NG(const int8_t *pw, int64_t gs, const float *s, const i8_x *x, int64_t ldx, \
                                  float *y, int64_t n0, int64_t N, int64_t kc, int flags) { \
        ukr_i8(R, NG, pw, gs, s, x, ldx, y, n0, N, kc, flags); \
    }
UKR_I8(1, 2) UKR_I8(1, 1) UKR_I8(2, 1) UKR_I8(3, 1) UKR_I8(4, 1) UKR_I8(5, 1) UKR_I8(6, 1) UKR_I8(7, 1) UKR_I8(8, 1)
typedef void (*ukr_i8_fn)(const int8_t *, int64_t, const float *, const i8_x *, int64_t, float *, int64_t, int64_t,
                          int64_t, int);
static const ukr_i8_fn UKRS_I8[I8_MR + 1] = {0, ukr_i8_1_1, ukr_i8_2_1, ukr_i8_3_1, ukr_i8_4_1,
                                             ukr_i8_5_1, ukr_i8_6_1, ukr_i8_7_1, ukr_i8_8_1};

/* the driver's tile: rows [m, m + mr), groups [g, g + ng), k in [k0, k0 + kc) (multiples of I8_STEP) */
static void tile_i8(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                    int flags) {
    const i8_args *a = args;
    const int8_t *pw = a->p + (g * a->K2 + k0) * QT_NC;
    const float *s = (const float *)a->s + g * QT_NC;
    const i8_x *x = i8_x_at(a, ws, m, k0);
    float *y = a->y + m * a->N;
    if (ng == 2)
        ukr_i8_1_2(pw, a->K2 * QT_NC, s, x, a->K2, y, g * QT_NC, a->N, kc, flags);
    else
        UKRS_I8[mr](pw, 0, s, x, a->K2, y, g * QT_NC, a->N, kc, flags);
}
#endif

/* p from ridgeline_pack_i8_gemm */
int ridgeline_gemm_i8p(const int8_t *p, const float *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads) {
#ifdef __AVX512F__
    if (M < 1 || N < 1 || K < 1) return -1;
    const int64_t G = (N + QT_NC - 1) / QT_NC, K2 = I8_STEP == 2 ? K + (K & 1) : K;
    const int64_t KC = qt_k_block(M, K2, sizeof(i8_x), I8_STEP), rows = qt_chunk_rows(KC, sizeof(i8_x), I8_MR);
    const i8_args a = {p, s, x, y, N, K, K2};
    const td_plan plan = {.M = M, .groups = G, .K = K2, .KC = KC, .rows = rows, .mr = I8_MR, .wide = 1,
                          .ws_bytes = i8_x_bytes(M, K2), .own_rows = TD_OWN_ROWS, .cols = QT_NC};
    return ridgeline_td_run(&plan, &a, I8_PREP, tile_i8, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
