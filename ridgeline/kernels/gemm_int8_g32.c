/* y[M, N] = x[M, K] @ W^T for int8 weights with one fp16 scale per group of 32 consecutive k of an
 * output channel (GGUF Q8_0's grid), fp32 x and y.
 * w[n][k] = d[n][k / 32] * q[n][k], q in [-127, 127]; K a multiple of 32.
 * With AVX512-BF16 and VNNI each row of x is first held as int16 per block of 32 k with one fp32 scale
 * (xq = round(x * 32767 / max|x|), sx = max|x| / 32767: a step of 1 / 65534 of the block's largest value,
 * finer than bf16's 2^-9 of each value wherever that value is above 1/128 of the block's largest), so a
 * k pair of 16 columns is one sign extension of the weights' bytes and one vpdpwssd (exact int32 sums:
 * 32 x 127 x 32767 < 2^31), three times fewer instructions per weight byte than converting them to bf16 pairs:
 * one row streams the weights at the memory's pace rather than at the conversion's. A block holding a value that
 * is not finite gives every output NaN. Without VNNI, x is rounded to bf16 (vdpbf16ps) or kept fp32 (FMAs).
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

#if I8_BF16 && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define I8G_I16 1
/* x as the int16 kernel reads it: per row [K] int16 values, then [K / 32] fp32 block scales */
static inline int16_t *x16_row(void *ws, int64_t K, int64_t m) { return (int16_t *)ws + m * (K + 2 * (K / I8G)); }

/* the driver's prep: rows [r0, r1) of x -> int16 blocks of 32 with their scales (the header's rounding) */
static void prep_x16(const void *args, void *ws, int64_t r0, int64_t r1) {
    const i8_args *a = args;
    for (int64_t m = r0; m < r1; m++) {
        const float *x = a->x + m * a->K;
        int16_t *q = x16_row(ws, a->K, m);
        float *sx = (float *)(q + a->K);
        for (int64_t b = 0; b < a->K / I8G; b++) {
            const __m512 v0 = _mm512_loadu_ps(x + b * I8G), v1 = _mm512_loadu_ps(x + b * I8G + 16);
            const float mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_sub_ps(v0, v0), _mm512_setzero_ps(), _CMP_NEQ_UQ) |
                                  _mm512_cmp_ps_mask(_mm512_sub_ps(v1, v1), _mm512_setzero_ps(), _CMP_NEQ_UQ);
            const __m512 inv = _mm512_set1_ps(mx > 0.f && !bad ? 32767.f / mx : 0.f);
            _mm256_storeu_si256((__m256i *)(q + b * I8G), _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv))));
            _mm256_storeu_si256((__m256i *)(q + b * I8G + 16),
                                _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv))));
            sx[b] = bad ? __builtin_nanf("") : mx / 32767.f;
        }
    }
}

/* as ukr_i8g, x read as prep_x16 writes it (rows of stride ldx int16s): per quantization group an exact int32
 * sum T of q xq over its 32 k (16 pairs), folded as acc += T * (d * sx) */
static inline __attribute__((always_inline)) void
ukr_i16(const int mr, const int ng, const int8_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, const int16_t *x,
        const float *sx, int64_t ldx, float *y, int64_t n0, int64_t N, int64_t kg, int flags) {
    __m512 acc[I8G_MR][2 * QT_NR];
    const int nv = ng * QT_NR;
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t b = 0; b < kg; b++) {
        __m512i T[I8G_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) T[i][v] = _mm512_setzero_si512();
        for (int64_t k = b * I8G; k < (b + 1) * I8G; k += 2) {
            __m512i wv[2 * QT_NR];
            for (int c = 0; c < ng; c++) w_prefetch(pw + c * gs + k * QT_NC, 2, mr); /* 96 bytes per pair */
            for (int v = 0; v < nv; v++)
                wv[v] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(pw + (v / QT_NR) * gs + k * QT_NC +
                                                                                   32 * (v % QT_NR))));
            for (int i = 0; i < mr; i++) {
                int32_t pair;
                memcpy(&pair, x + i * ldx + k, 4);
                const __m512i xp = _mm512_set1_epi32(pair);
                for (int v = 0; v < nv; v++) T[i][v] = _mm512_dpwssd_epi32(T[i][v], xp, wv[v]);
            }
        }
        for (int v = 0; v < nv; v++) {
            const uint16_t *sv = sc + (v / QT_NR) * ss + b * QT_NC + 16 * (v % QT_NR);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sv));
            for (int i = 0; i < mr; i++)
                acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T[i][v]), _mm512_mul_ps(d, _mm512_set1_ps(sx[i * ldx / 2 + b])),
                                            acc[i][v]);
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_i16_fn)(const int8_t *, int64_t, const uint16_t *, int64_t, const int16_t *, const float *,
                           int64_t, float *, int64_t, int64_t, int64_t, int);
#define UKR_I16(R, NG) \
    static void ukr_i16_##R##_##NG(const int8_t *pw, int64_t gs, const uint16_t *sc, int64_t ss, const int16_t *x, \
                                   const float *sx, int64_t ldx, float *y, int64_t n0, int64_t N, int64_t kg, \
                                   int flags) { \
        ukr_i16(R, NG, pw, gs, sc, ss, x, sx, ldx, y, n0, N, kg, flags); \
    }
UKR_I16(1, 2) UKR_I16(1, 1) UKR_I16(2, 1) UKR_I16(3, 1) UKR_I16(4, 1)
static const ukr_i16_fn UKRS_I16[I8G_MR + 1] = {0, ukr_i16_1_1, ukr_i16_2_1, ukr_i16_3_1, ukr_i16_4_1};

static void tile_i16(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                     int flags) {
    const i8_args *a = args;
    const int64_t gs = a->K2 * QT_NC, ss = a->K2 / I8G * QT_NC, ldx = a->K + 2 * (a->K / I8G);
    const int16_t *x = x16_row((void *)ws, a->K, m);
    const ukr_i16_fn f = ng == 2 ? ukr_i16_1_2 : UKRS_I16[mr];
    /* a row's scales sit after its K values: sx[i * ldx / 2 + b] from the first row's, ldx int16s a row */
    f(a->p + g * gs + k0 * QT_NC, gs, (const uint16_t *)a->s + g * ss + k0 / I8G * QT_NC, ss, x + k0,
      (const float *)(x + a->K) + k0 / I8G, ldx, a->y + m * a->N, g * QT_NC, a->N, kc / I8G, flags);
}
#else
#define I8G_I16 0
#endif

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

/* how the kernel reads x: 0 fp32, 1 rounded to bf16, 2 int16 per block of 32 k (the header) */
int ridgeline_i8g32_activations(void) {
#ifdef __AVX512F__
    return I8G_I16 ? 2 : I8_BF16;
#else
    return 0;
#endif
}

int ridgeline_gemm_i8g32(const int8_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                         int64_t K, int nthreads) {
#ifdef __AVX512F__
    if (M < 1 || N < 1 || K < 1 || K % I8G) return -1;
    const int64_t G = (N + QT_NC - 1) / QT_NC, KC = qt_k_block(M, K, sizeof(i8_x), I8G);
    const i8_args a = {p, s, x, y, N, K, K};
#if I8G_I16
    const size_t row = (size_t)(K + 2 * (K / I8G)) * sizeof(int16_t);
    const td_plan p16 = {.M = M, .groups = G, .K = K, .KC = KC, .rows = qt_chunk_rows(KC, sizeof(int16_t), I8G_MR),
                         .mr = I8G_MR, .wide = 1, .ws_bytes = (size_t)M * row, .own_rows = TD_OWN_ROWS, .cols = QT_NC};
    return ridgeline_td_run(&p16, &a, prep_x16, tile_i16, nthreads);
#endif
    const td_plan plan = {.M = M, .groups = G, .K = K, .KC = KC, .rows = qt_chunk_rows(KC, sizeof(i8_x), I8G_MR),
                          .mr = I8G_MR, .wide = 1, .ws_bytes = i8_x_bytes(M, K), .own_rows = TD_OWN_ROWS,
                          .cols = QT_NC};
    return ridgeline_td_run(&plan, &a, I8_PREP, tile_i8g, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
