/* y[M, N] = x[M, K] @ W[N, K]^T with W packed once at load time into column panels, for every M
 * (decode batches and prefill chunks alike), fp32 x and y:
 *   fp32 W: P[g][k][NC]        NC = NR * 16 output columns per group g, zero-padded past N
 *   bf16 W: P[g][k/2][NC][2]   pairs of k per column, the operand order of vdpbf16ps
 * Each group is one contiguous stream (the hardware prefetcher follows it). The register tile is
 * MR rows of x by NC columns: per k, NR vector loads of W and MR broadcasts of x feed MR * NR
 * fused multiply-adds, and the accumulators hold whole output vectors (no horizontal reductions).
 * Groups are split across threads; x is taken in blocks (a chunk of rows by a block of k) that fit
 * L2 while a thread's groups stream past; a k block after the first adds to the partial sums stored
 * in y. Each output element sums k in the same order whatever M is, so a row's result does not
 * depend on the batch it shares. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tile_driver.h"
#include "weight_prefetch.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define NR 3
#define NC (NR * 16)
#define MR 8
#ifndef X_CHUNK_BYTES
#define X_CHUNK_BYTES (768 * 1024) /* a block of x: most of L2 */
#endif
#define KC_MAX 1024 /* k per block at most */
#ifndef STREAM_OUT_BYTES
#define STREAM_OUT_BYTES (8 << 20)
#endif

int ridgeline_packed_cols(void) { return NC; }

int ridgeline_packed_available(int bf16) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    (void)bf16;
    return 1;
#elif defined(__AVX512F__)
    return !bf16;
#else
    (void)bf16;
    return 0;
#endif
}

static int64_t groups_of(int64_t N) { return (N + NC - 1) / NC; }

/* w [N, K] fp32 -> p [groups][K][NC] */
int ridgeline_pack_f32(const float *w, float *p, int64_t N, int64_t K) {
    const int64_t G = groups_of(N);
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t k = 0; k < K; k++) {
            float *dst = p + (g * K + k) * NC;
            for (int64_t c = 0; c < NC; c++) {
                const int64_t n = g * NC + c;
                dst[c] = n < N ? w[n * K + k] : 0.f;
            }
        }
    return 0;
}

/* w [N, K] bf16 -> p [groups][Kp/2][NC][2], Kp = K rounded up to even */
int ridgeline_pack_bf16(const uint16_t *w, uint16_t *p, int64_t N, int64_t K) {
    const int64_t G = groups_of(N), Kh = (K + 1) / 2;
    #pragma omp parallel for
    for (int64_t g = 0; g < G; g++)
        for (int64_t kk = 0; kk < Kh; kk++) {
            uint16_t *dst = p + (g * Kh + kk) * NC * 2;
            for (int64_t c = 0; c < NC; c++)
                for (int e = 0; e < 2; e++) {
                    const int64_t n = g * NC + c, k = 2 * kk + e;
                    dst[2 * c + e] = n < N && k < K ? w[n * K + k] : 0;
                }
        }
    return 0;
}

#ifdef __AVX512F__
static inline __mmask16 col_mask(int64_t n0, int64_t N) {
    const int64_t left = N - n0;
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* the mr x NC tile of y at columns n0..: zeros, or (TD_ACC) the partial sums stored there */
static inline __attribute__((always_inline)) void
acc_start(const int mr, __m512 acc[MR][NR], const float *y, int64_t n0, int64_t N, int flags) {
    for (int j = 0; j < NR; j++) {
        const __mmask16 m = col_mask(n0 + 16 * j, N);
        for (int i = 0; i < mr; i++)
            acc[i][j] = flags & TD_ACC ? _mm512_maskz_loadu_ps(m, y + i * N + n0 + 16 * j) : _mm512_setzero_ps();
    }
}

static inline __attribute__((always_inline)) void
acc_store(const int mr, __m512 acc[MR][NR], float *y, int64_t n0, int64_t N, int flags) {
    for (int j = 0; j < NR; j++) {
        const __mmask16 m = col_mask(n0 + 16 * j, N);
        if (flags & TD_STREAM && m == 0xFFFF)
            for (int i = 0; i < mr; i++) _mm512_stream_ps(y + i * N + n0 + 16 * j, acc[i][j]);
        else if (m)
            for (int i = 0; i < mr; i++) _mm512_mask_storeu_ps(y + i * N + n0 + 16 * j, m, acc[i][j]);
    }
}

/* mr rows of x (stride ldx) against one group pw [K][NC] -> y rows (stride N) at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_f32(const int mr, const float *pw, const float *x, int64_t ldx, float *y, int64_t n0, int64_t N, int64_t K,
        int flags) {
    __m512 acc[MR][NR];
    acc_start(mr, acc, y, n0, N, flags);
    for (int64_t k = 0; k < K; k++) {
        __m512 wv[NR];
        w_prefetch(pw + k * NC, NR, mr);
        for (int j = 0; j < NR; j++) wv[j] = _mm512_loadu_ps(pw + k * NC + 16 * j);
        for (int i = 0; i < mr; i++) {
            const __m512 xb = _mm512_set1_ps(x[i * ldx + k]);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xb, wv[j], acc[i][j]);
        }
    }
    acc_store(mr, acc, y, n0, N, flags);
}

#define UKR_F32(R) \
    static void ukr_f32_##R(const float *pw, const float *x, int64_t ldx, float *y, int64_t n0, int64_t N, int64_t K, \
                            int flags) { \
        ukr_f32(R, pw, x, ldx, y, n0, N, K, flags); \
    }
UKR_F32(1) UKR_F32(2) UKR_F32(3) UKR_F32(4) UKR_F32(5) UKR_F32(6) UKR_F32(7) UKR_F32(8)
typedef void (*ukr_f32_fn)(const float *, const float *, int64_t, float *, int64_t, int64_t, int64_t, int);
static const ukr_f32_fn UKRS_F32[MR + 1] = {0, ukr_f32_1, ukr_f32_2, ukr_f32_3, ukr_f32_4,
                                             ukr_f32_5, ukr_f32_6, ukr_f32_7, ukr_f32_8};
#endif

/* Outputs far larger than L2 (the LM head's logits) bypass the caches: their rows, N * 4 bytes
 * apart, all fall in the same few cache sets. Streaming stores need 64-byte aligned rows. */
static int stream_out(const float *y, int64_t M, int64_t N) {
    return M * N * 4 > STREAM_OUT_BYTES && N % 16 == 0 && ((uintptr_t)y & 63) == 0;
}

/* k per block: all of K when the whole x fits a block, else K split evenly into blocks of at most
 * KC_MAX, even (bf16 pairs) */
static int64_t k_block(int64_t M, int64_t K, int64_t elem) {
    if (M * K * elem <= X_CHUNK_BYTES) return K;
    const int64_t nb = (K + KC_MAX - 1) / KC_MAX, kc = (K + nb - 1) / nb;
    return (kc + 1) & ~(int64_t)1;
}

static int64_t chunk_rows(int64_t kc, int64_t elem) {
    int64_t r = X_CHUNK_BYTES / (kc * elem) / MR * MR;
    return r < MR ? MR : r;
}

#ifdef __AVX512F__
/* One call's operands, for the driver's callbacks (tile_driver.h). */
typedef struct {
    const void *p;  /* packed W */
    const float *x; /* fp32 x [M][K] */
    float *y;
    int64_t N, K, Kp; /* Kp: K rounded up to even (bf16: the prepared rows' length) */
} gemm_args;

/* the driver's tile: rows [m, m + mr) against group g, k in [k0, k0 + kc) */
static void tile_f32(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                     int flags) {
    const gemm_args *a = args;
    (void)ws; (void)ng;
    UKRS_F32[mr]((const float *)a->p + (g * a->K + k0) * NC, a->x + m * a->K + k0, a->K, a->y + m * a->N, g * NC, a->N,
                 kc, flags);
}
#endif

int ridgeline_gemm_f32p(const float *p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads) {
#ifdef __AVX512F__
    if (M < 1 || N < 1 || K < 1) return -1;
    const int64_t KC = k_block(M, K, 4);
    const gemm_args a = {p, x, y, N, K, K};
    const td_plan plan = {.M = M, .groups = groups_of(N), .K = K, .KC = KC, .rows = chunk_rows(KC, 4), .mr = MR,
                          .flags = KC >= K && stream_out(y, M, N) ? TD_STREAM : 0, .cols = NC};
    return ridgeline_td_run(&plan, &a, NULL, tile_f32, nthreads);
#else
    (void)p; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* mr rows of xb (bf16, stride ldx, even) against one group pw [Kh][NC][2] */
static inline __attribute__((always_inline)) void
ukr_bf16(const int mr, const uint16_t *pw, const uint16_t *xb, int64_t ldx, float *y, int64_t n0, int64_t N,
         int64_t Kh, int flags) {
    __m512 acc[MR][NR];
    acc_start(mr, acc, y, n0, N, flags);
    for (int64_t kk = 0; kk < Kh; kk++) {
        __m512bh wv[NR];
        w_prefetch(pw + kk * NC * 2, NR, mr); /* NR lines per pair of k */
        for (int j = 0; j < NR; j++) wv[j] = (__m512bh)_mm512_loadu_si512(pw + (kk * NC + 16 * j) * 2);
        for (int i = 0; i < mr; i++) {
            int32_t pair;
            memcpy(&pair, xb + i * ldx + 2 * kk, 4);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
        }
    }
    acc_store(mr, acc, y, n0, N, flags);
}

#define UKR_BF16(R) \
    static void ukr_bf16_##R(const uint16_t *pw, const uint16_t *xb, int64_t ldx, float *y, int64_t n0, int64_t N, \
                             int64_t Kh, int flags) { \
        ukr_bf16(R, pw, xb, ldx, y, n0, N, Kh, flags); \
    }
UKR_BF16(1) UKR_BF16(2) UKR_BF16(3) UKR_BF16(4) UKR_BF16(5) UKR_BF16(6) UKR_BF16(7) UKR_BF16(8)
typedef void (*ukr_bf16_fn)(const uint16_t *, const uint16_t *, int64_t, float *, int64_t, int64_t, int64_t, int);
static const ukr_bf16_fn UKRS_BF16[MR + 1] = {0, ukr_bf16_1, ukr_bf16_2, ukr_bf16_3, ukr_bf16_4,
                                               ukr_bf16_5, ukr_bf16_6, ukr_bf16_7, ukr_bf16_8};

/* x [M, K] fp32 -> xb [M, Kp] bf16 (round to nearest even), zero-padded to Kp */
static void to_bf16_rows(const float *x, uint16_t *xb, int64_t M, int64_t K, int64_t Kp) {
    for (int64_t m = 0; m < M; m++) {
        const float *src = x + m * K;
        uint16_t *dst = xb + m * Kp;
        for (int64_t k = 0; k < Kp; k += 32) {
            const int64_t left = K - k;
            const __mmask16 lo = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            const __mmask16 hi = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            const __m512 a = _mm512_maskz_loadu_ps(lo, src + k), b = _mm512_maskz_loadu_ps(hi, src + k + 16);
            const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            const int64_t n = Kp - k < 32 ? Kp - k : 32;
            _mm512_mask_storeu_epi16(dst + k, (__mmask32)(n == 32 ? 0xFFFFFFFFu : (1u << n) - 1), v);
        }
    }
}

/* the driver's prep: rows [r0, r1) of x rounded to bf16, [M][Kp] */
static void prep_bf16(const void *args, void *ws, int64_t r0, int64_t r1) {
    const gemm_args *a = args;
    to_bf16_rows(a->x + r0 * a->K, (uint16_t *)ws + r0 * a->Kp, r1 - r0, a->K, a->Kp);
}

/* the driver's tile; k0 and kc count elements of the even-padded Kp; the packed W and ukr count pairs */
static void tile_bf16(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                      int flags) {
    const gemm_args *a = args;
    (void)ng;
    UKRS_BF16[mr]((const uint16_t *)a->p + (g * (a->Kp / 2) + k0 / 2) * NC * 2, (const uint16_t *)ws + m * a->Kp + k0,
                  a->Kp, a->y + m * a->N, g * NC, a->N, kc / 2, flags);
}
#endif

int ridgeline_gemm_bf16p(const uint16_t *p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1) return -1;
    const int64_t Kp = K + (K & 1), KC = k_block(M, Kp, 2);
    const gemm_args a = {p, x, y, N, K, Kp};
    const td_plan plan = {.M = M, .groups = groups_of(N), .K = Kp, .KC = KC, .rows = chunk_rows(KC, 2), .mr = MR,
                          .flags = KC >= Kp && stream_out(y, M, N) ? TD_STREAM : 0,
                          .ws_bytes = (size_t)(M * Kp) * sizeof(uint16_t), .cols = NC}; /* one shared copy */
    return ridgeline_td_run(&plan, &a, prep_bf16, tile_bf16, nthreads);
#else
    (void)p; (void)x; (void)y; (void)M; (void)N; (void)K; (void)nthreads;
    return -2;
#endif
}
