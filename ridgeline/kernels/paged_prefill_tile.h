/* Micro-kernels of the tiled prefill attention (paged_prefill.c), AVX-512 only. A task's query rows
 * (consecutive positions x the G query heads of one KV head) lie across the 16 lanes of RV vectors,
 * so scores come out as S^T [key][rows]: the online-softmax max, exp and sum are lane-wise, with no
 * horizontal reduction. Layouts (RP = RV * 16 padded rows, KT keys per tile):
 *   bf16 (vdpbf16ps):  Q^T pairs [D/2][RP] u32 (q[2i], q[2i+1]) rounded to bf16 once per task;
 *                      K read in place, one (key, dim pair) broadcast per step;
 *                      P pairs [KT/2][RP] u32 (p[2k], p[2k+1]); V pairs [KT/2][D] u32 (v[2k][d], v[2k+1][d])
 *   fp32 (FMA):        Q^T [D][RP] f32; K and V dequantized rows [KT][D] f32; P^T [KT][RP] f32
 * Every row's arithmetic depends on its own q and keys and on the fixed tile boundaries only, never on
 * the other rows of its task: a row's result is the same whatever block it is computed in. */
#pragma once
#include <float.h>
#include <immintrin.h>
#include "vexp.h"

#define KT 32     /* keys per tile; tiles start at multiples of KT positions */
#define KG 8      /* keys per register block of the score kernels */
#define RV_MAX 3  /* row vectors per task: up to 48 query rows */
#define RP_MAX (16 * RV_MAX)

static inline __m512 bcast_f32(const float *p) { return _mm512_set1_ps(*p); }
static inline __m512i bcast_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32((int)v);
}
#ifdef __AVX512BF16__
static inline __m512bh as_bh(__m512i v) {
    __m512bh r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* S^T[k][r] = scale * q_r . k_k for the tile's KT keys, bf16 pairs; kp[k]: key k's row (zeros if unused) */
static inline __attribute__((always_inline)) void qk_bf16(const uint32_t *qp, const uint16_t *const *kp, float *st,
                                                         int64_t D, float scale, const int RV) {
    const int64_t RP = 16 * RV;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int k0 = 0; k0 < KT; k0 += KG) {
        __m512 acc[RV_MAX][KG];
        for (int v = 0; v < RV; v++)
            for (int j = 0; j < KG; j++) acc[v][j] = _mm512_setzero_ps();
        for (int64_t dp = 0; dp < D / 2; dp++) {
            __m512bh qv[RV_MAX];
            for (int v = 0; v < RV; v++) qv[v] = as_bh(_mm512_load_si512(qp + dp * RP + 16 * v));
            for (int j = 0; j < KG; j++) {
                const __m512bh kb = as_bh(bcast_u32(kp[k0 + j] + 2 * dp));
                for (int v = 0; v < RV; v++) acc[v][j] = _mm512_dpbf16_ps(acc[v][j], kb, qv[v]);
            }
        }
        for (int j = 0; j < KG; j++)
            for (int v = 0; v < RV; v++) _mm512_store_ps(st + (k0 + j) * RP + 16 * v, _mm512_mul_ps(acc[v][j], vs));
    }
}

#endif

/* the same in fp32 over dequantized key rows kf [KT][D] */
static inline __attribute__((always_inline)) void qk_f32(const float *qt, const float *kf, float *st, int64_t D,
                                                        float scale, const int RV) {
    const int64_t RP = 16 * RV;
    const __m512 vs = _mm512_set1_ps(scale);
    for (int k0 = 0; k0 < KT; k0 += KG) {
        __m512 acc[RV_MAX][KG];
        for (int v = 0; v < RV; v++)
            for (int j = 0; j < KG; j++) acc[v][j] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            __m512 qv[RV_MAX];
            for (int v = 0; v < RV; v++) qv[v] = _mm512_load_ps(qt + d * RP + 16 * v);
            for (int j = 0; j < KG; j++) {
                const __m512 kb = bcast_f32(kf + (k0 + j) * D + d);
                for (int v = 0; v < RV; v++) acc[v][j] = _mm512_fmadd_ps(kb, qv[v], acc[v][j]);
            }
        }
        for (int j = 0; j < KG; j++)
            for (int v = 0; v < RV; v++) _mm512_store_ps(st + (k0 + j) * RP + 16 * v, _mm512_mul_ps(acc[v][j], vs));
    }
}

/* Online softmax over one tile, lane-wise. Key t0 + k is visible to row r iff first[r] <= t0 + k <
 * len[r]. m starts at -FLT_MAX (finite): a tile a row cannot see leaves its m, l and output unchanged
 * (alpha = exp(0) = 1 exactly, p = 0). Writes p into st (in place), alpha [RP] and updates m, l. */
static inline __attribute__((always_inline)) void softmax_tile(float *st, const int32_t *first, const int32_t *len,
                                                              int64_t t0, float *m, float *l, float *alpha,
                                                              const int RV) {
    const int64_t RP = 16 * RV;
    for (int v = 0; v < RV; v++) {
        const __m512i fv = _mm512_load_si512(first + 16 * v), lv = _mm512_load_si512(len + 16 * v);
        __mmask16 mk[KT];
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int k = 0; k < KT; k++) {
            const __m512i kk = _mm512_set1_epi32((int)(t0 + k));
            mk[k] = _mm512_cmple_epi32_mask(fv, kk) & _mm512_cmplt_epi32_mask(kk, lv);
            mx = _mm512_mask_max_ps(mx, mk[k], mx, _mm512_load_ps(st + k * RP + 16 * v));
        }
        const __m512 mo = _mm512_load_ps(m + 16 * v), mn = _mm512_max_ps(mo, mx);
        const __m512 a = vexp512(_mm512_sub_ps(mo, mn));
        __m512 sum = _mm512_setzero_ps();
        for (int k = 0; k < KT; k++) {
            float *s = st + k * RP + 16 * v;
            const __m512 p = _mm512_maskz_mov_ps(mk[k], vexp512(_mm512_sub_ps(_mm512_load_ps(s), mn)));
            sum = _mm512_add_ps(sum, p);
            _mm512_store_ps(s, p);
        }
        _mm512_store_ps(m + 16 * v, mn);
        _mm512_store_ps(alpha + 16 * v, a);
        _mm512_store_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_load_ps(l + 16 * v), a, sum));
    }
}

#ifdef __AVX512BF16__
/* P^T fp32 [KT][RP] -> bf16 pairs [KT/2][RP] u32: lane r of pair row i = (p[2i][r], p[2i+1][r]) */
static inline void pack_p_bf16(const float *st, uint32_t *pp, int64_t RP) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int i = 0; i < KT / 2; i++)
        for (int64_t v = 0; v < RP; v += 16) {
            const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_load_ps(st + (2 * i + 1) * RP + v),
                                                   _mm512_load_ps(st + 2 * i * RP + v));
            __m512i w;
            memcpy(&w, &b, sizeof w);
            _mm512_store_si512(pp + i * RP + v, _mm512_permutexvar_epi16(idx, w));
        }
}

/* V rows of key pairs -> pairs [KT/2][D] u32 (D a multiple of 16) */
static inline void pack_v_bf16(const uint16_t *const *vp, uint32_t *out, int64_t D) {
    for (int i = 0; i < KT / 2; i++)
        for (int64_t d = 0; d < D; d += 16) {
            const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vp[2 * i] + d)));
            const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vp[2 * i + 1] + d)));
            _mm512_store_si512(out + i * D + d, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
        }
}

#endif

/* O[r] = alpha[r] O[r] + sum_k p[k][r] v[k] for rows [0, rows4) in groups of 4 and dims in NE vectors.
 * bf16: pairs of keys per vdpbf16ps; fp32: one key per FMA. O [RP][D]. */
#define PV_KERNEL(NAME, PT, VT, STEPS, PBC, VLD, MAC)                                                             \
    static inline __attribute__((always_inline)) void NAME(const PT *p, const VT *v, const float *alpha, float *o,  \
                                                          int64_t rows4, int64_t D, int64_t RP, const int NE) {      \
        for (int64_t r = 0; r < rows4; r += 4)                                                                     \
            for (int64_t d0 = 0; d0 < D; d0 += 16 * NE) {                                                          \
                __m512 acc[4][4];                                                                                  \
                for (int i = 0; i < 4; i++) {                                                                      \
                    const __m512 a = _mm512_set1_ps(alpha[r + i]);                                                 \
                    for (int e = 0; e < NE; e++)                                                                   \
                        acc[i][e] = _mm512_mul_ps(a, _mm512_load_ps(o + (r + i) * D + d0 + 16 * e));              \
                }                                                                                                  \
                for (int k = 0; k < STEPS; k++) {                                                                  \
                    VLD;                                                                                           \
                    for (int i = 0; i < 4; i++) {                                                                  \
                        PBC;                                                                                       \
                        for (int e = 0; e < NE; e++) acc[i][e] = MAC;                                              \
                    }                                                                                              \
                }                                                                                                  \
                for (int i = 0; i < 4; i++)                                                                        \
                    for (int e = 0; e < NE; e++) _mm512_store_ps(o + (r + i) * D + d0 + 16 * e, acc[i][e]);       \
            }                                                                                                      \
    }

#ifdef __AVX512BF16__
PV_KERNEL(pv_bf16, uint32_t, uint32_t, KT / 2, const __m512bh pb = as_bh(bcast_u32(p + k * RP + r + i)),
          __m512bh vv[4]; for (int e = 0; e < NE; e++) vv[e] = as_bh(_mm512_load_si512(v + k * D + d0 + 16 * e)),
          _mm512_dpbf16_ps(acc[i][e], pb, vv[e]))
#endif
PV_KERNEL(pv_f32, float, float, KT, const __m512 pb = bcast_f32(p + k * RP + r + i),
          __m512 vv[4]; for (int e = 0; e < NE; e++) vv[e] = _mm512_load_ps(v + k * D + d0 + 16 * e),
          _mm512_fmadd_ps(pb, vv[e], acc[i][e]))

/* Each micro-kernel compiled on its own (noinline), one copy per row-vector count RV (and NE): inlined
 * into one task body, the compiler hoisted the softmax's exp constants out of the tile loop and spilled
 * the score kernel's accumulators to the stack to make room (a load and a store around every
 * vdpbf16ps). Kept apart, each keeps its accumulators in registers; the arithmetic is the same. */
#define PF_RV_WRAP(NAME, RV, PARAMS, ARGS) \
    static __attribute__((noinline)) void NAME##_##RV PARAMS { NAME ARGS; }
#ifdef __AVX512BF16__
#define QK_BF16_WRAP(RV) PF_RV_WRAP(qk_bf16, RV, \
    (const uint32_t *qp, const uint16_t *const *kp, float *st, int64_t D, float scale), (qp, kp, st, D, scale, RV))
QK_BF16_WRAP(1)
QK_BF16_WRAP(2)
QK_BF16_WRAP(3)
#endif
#define QK_F32_WRAP(RV) PF_RV_WRAP(qk_f32, RV, \
    (const float *qt, const float *kf, float *st, int64_t D, float scale), (qt, kf, st, D, scale, RV))
QK_F32_WRAP(1)
QK_F32_WRAP(2)
QK_F32_WRAP(3)
#define SOFTMAX_WRAP(RV) PF_RV_WRAP(softmax_tile, RV, \
    (float *st, const int32_t *first, const int32_t *len, int64_t t0, float *m, float *l, float *alpha), \
    (st, first, len, t0, m, l, alpha, RV))
SOFTMAX_WRAP(1)
SOFTMAX_WRAP(2)
SOFTMAX_WRAP(3)
#define PV_NE_WRAP(NAME, PT, VT, NE) \
    static __attribute__((noinline)) void NAME##_##NE(const PT *p, const VT *v, const float *alpha, float *o, \
                                                      int64_t rows4, int64_t D, int64_t RP) { \
        NAME(p, v, alpha, o, rows4, D, RP, NE); \
    }
#ifdef __AVX512BF16__
PV_NE_WRAP(pv_bf16, uint32_t, uint32_t, 1)
PV_NE_WRAP(pv_bf16, uint32_t, uint32_t, 2)
PV_NE_WRAP(pv_bf16, uint32_t, uint32_t, 4)
#endif
PV_NE_WRAP(pv_f32, float, float, 1)
PV_NE_WRAP(pv_f32, float, float, 2)
PV_NE_WRAP(pv_f32, float, float, 4)
/* by the compile-time RV / NE of the caller */
#define PF_BY_RV(NAME, RV, ...) ((RV) == 1 ? NAME##_1(__VA_ARGS__) : (RV) == 2 ? NAME##_2(__VA_ARGS__) : NAME##_3(__VA_ARGS__))
#define PF_BY_NE(NAME, NE, ...) ((NE) == 1 ? NAME##_1(__VA_ARGS__) : (NE) == 2 ? NAME##_2(__VA_ARGS__) : NAME##_4(__VA_ARGS__))
