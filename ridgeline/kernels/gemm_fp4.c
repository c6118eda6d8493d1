/* y[M, N] = x[M, K] @ W^T for fp4 (E2M1) weights, computed natively with integer dot products
 * (vpdpbusd, AVX512-VNNI), as llama.cpp computes MXFP4: x is quantized to int8 inside the call, per
 * row and block of B consecutive k (the weight's block), a = max|x| / 127, r = round(x / a) in
 * [-127, 127] (the int8 formats' activations, gemm_a8.c). So the fp4 formats quantize activations:
 * that is part of the format, at every batch size.
 *   MXFP4: B = 32, w = 2^(e - 127) * v, e one E8M0 byte per block and column
 *   NVFP4: B = 16, w = t * d * v, d one E4M3 byte per block and column, t fp32 for the tensor
 *   v an E2M1 value (+-{0, 0.5, 1, 1.5, 2, 3, 4, 6}) stored as its 4-bit code (sign << 3 | index)
 *   P[g][k/8][NC] uint32: the codes in gemm_int4.c's nibble layout (ridgeline_pack_i4)
 *   S: 64 bytes of header (fp32 c: 0.5 for MXFP4, 128 t for NVFP4), then [g][K/B][NC] scale bytes
 * A byte shuffle (vpshufb) maps each code to u = 2v + 12, an integer in [0, 24]: the unsigned operand
 * of vpdpbusd against the signed r. Per block the sum T = sum r u is exact in int32, and
 * sum r v = (T - 12 R) / 2 with R = sum r, so a block adds (T - 12 R) * (d' a) to the output, d' the
 * block scale times c (which holds the 1/2; for NVFP4 also the 2^8 of reading E4M3 as fp16 and t).
 * Blocks fold into the fp32 sums in k order, the same whatever the tile or the number of rows, so a
 * row's result never depends on how many rows share the call. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_tile.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define FP4_ISA 1
#else
#define FP4_ISA 0
#endif
#define FP4_HEADER 64 /* bytes before the block scales */

int ridgeline_fp4_available(void) { return FP4_ISA; }

#if FP4_ISA
#define FP4_MR 4

/* one row of K in blocks of B -> s8 r (each 8 k in nibble order: 0 4 1 5 2 6 3 7), per block a and R */
static void quant_row_blocks(const float *x, int8_t *r, float *a, int32_t *R, int64_t K, int64_t B) {
    const __m128i perm = _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    for (int64_t k0 = 0, b = 0; k0 < K; k0 += B, b++) {
        __m512 m = _mm512_setzero_ps();
        for (int64_t k = k0; k < k0 + B; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
        const float mx = _mm512_reduce_max_ps(m);
        const __m512 inv = _mm512_set1_ps(mx > 0 ? 127.f / mx : 0.f);
        __m512i sum = _mm512_setzero_si512();
        for (int64_t k = k0; k < k0 + B; k += 16) {
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128((__m128i *)(r + k), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(q), perm));
        }
        a[b] = mx / 127.f;
        R[b] = _mm512_reduce_add_epi32(sum);
    }
}

static inline int32_t load4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 16 scale bytes -> the block scale times c, per column */
static inline __m512 block_scale(const uint8_t *src, const int nv4, const __m512 c) {
    const __m128i b = _mm_loadu_si128((const __m128i *)src);
    if (nv4) /* E4M3 read as fp16: the value times 2^-8 (c holds the 2^8) */
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 7)), c);
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 23)), c); /* E8M0 */
}

/* mr rows of s8 xq (stride ldx; per block a, R with stride ldb) against ng (1 or 2) column groups of
 * codes (pw, group stride gs words; scales sc [K/B][NC] bytes, group stride ss) -> y rows at n0.. */
static inline __attribute__((always_inline)) void
ukr_fp4(const int mr, const int ng, const int B, const uint32_t *pw, int64_t gs, const uint8_t *sc, int64_t ss,
        float c, const int8_t *xq, int64_t ldx, const float *xa, const int32_t *xr, int64_t ldb, float *y,
        int64_t n0, int64_t N, int64_t KB) {
    const __m512i lo4 = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                               12, 11, 10, 9, 8, 6, 4, 0));
    const __m512 cv = _mm512_set1_ps(c);
    const int nv = ng * QT_NR;
    __m512 acc[FP4_MR][2 * QT_NR];
    for (int i = 0; i < mr; i++)
        for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
    for (int64_t b = 0; b < KB; b++) {
        __m512i T[FP4_MR][2 * QT_NR];
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) T[i][v] = _mm512_setzero_si512();
        for (int o = 0; o < B / 8; o++)
            for (int v = 0; v < nv; v++) {
                const __m512i w = _mm512_loadu_si512(pw + (v / QT_NR) * gs + (b * (B / 8) + o) * QT_NC +
                                                     16 * (v % QT_NR));
                const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(w, lo4));
                const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi32(w, 4), lo4));
                for (int i = 0; i < mr; i++) {
                    const int8_t *xk = xq + i * ldx + b * B + 8 * o;
                    T[i][v] = _mm512_dpbusd_epi32(T[i][v], lo, _mm512_set1_epi32(load4(xk)));
                    T[i][v] = _mm512_dpbusd_epi32(T[i][v], hi, _mm512_set1_epi32(load4(xk + 4)));
                }
            }
        for (int v = 0; v < nv; v++) {
            const __m512 d = block_scale(sc + (v / QT_NR) * ss + b * QT_NC + 16 * (v % QT_NR), B == 16, cv);
            for (int i = 0; i < mr; i++) {
                const __m512i t = _mm512_sub_epi32(T[i][v], _mm512_set1_epi32(12 * xr[i * ldb + b]));
                acc[i][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(d, _mm512_set1_ps(xa[i * ldb + b])),
                                            acc[i][v]);
            }
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_fp4_fn)(const uint32_t *, int64_t, const uint8_t *, int64_t, float, const int8_t *, int64_t,
                           const float *, const int32_t *, int64_t, float *, int64_t, int64_t, int64_t);
#define UKR_FP4(R, NG, B) \
    static void ukr_fp4_##R##_##NG##_##B(const uint32_t *pw, int64_t gs, const uint8_t *sc, int64_t ss, float c, \
                                         const int8_t *xq, int64_t ldx, const float *xa, const int32_t *xr, \
                                         int64_t ldb, float *y, int64_t n0, int64_t N, int64_t KB) { \
        ukr_fp4(R, NG, B, pw, gs, sc, ss, c, xq, ldx, xa, xr, ldb, y, n0, N, KB); \
    }
UKR_FP4(1, 2, 16) UKR_FP4(1, 1, 16) UKR_FP4(2, 1, 16) UKR_FP4(3, 1, 16) UKR_FP4(4, 1, 16)
UKR_FP4(1, 2, 32) UKR_FP4(1, 1, 32) UKR_FP4(2, 1, 32) UKR_FP4(3, 1, 32) UKR_FP4(4, 1, 32)
static const ukr_fp4_fn UKRS_FP4[2][FP4_MR + 1] = {
    {0, ukr_fp4_1_1_16, ukr_fp4_2_1_16, ukr_fp4_3_1_16, ukr_fp4_4_1_16},
    {0, ukr_fp4_1_1_32, ukr_fp4_2_1_32, ukr_fp4_3_1_32, ukr_fp4_4_1_32}};
static const ukr_fp4_fn UKRS_FP4_WIDE[2] = {ukr_fp4_1_2_16, ukr_fp4_1_2_32};

typedef struct {
    const uint32_t *p;
    const uint8_t *s; /* block scales (past the header) */
    float c;
    const float *x;
    float *y;
    int64_t M, N, K, B;
} fp4_args;

/* the prepared x: xq [M][K] s8 r, then (64-byte aligned) a [M][K/B] fp32, then R [M][K/B] int32 */
static inline size_t fp4_a_offset(const fp4_args *f) { return ((size_t)(f->M * f->K) + 63) & ~(size_t)63; }
static inline size_t fp4_r_offset(const fp4_args *f) {
    return fp4_a_offset(f) + (((size_t)(f->M * (f->K / f->B)) * sizeof(float) + 63) & ~(size_t)63);
}

/* the driver's prep: rows [r0, r1) of x quantized to int8 per block */
static void prep_fp4(const void *args, void *ws, int64_t r0, int64_t r1) {
    const fp4_args *f = args;
    const int64_t K = f->K, KB = K / f->B;
    float *xa = (float *)((uint8_t *)ws + fp4_a_offset(f));
    int32_t *xr = (int32_t *)((uint8_t *)ws + fp4_r_offset(f));
    for (int64_t m = r0; m < r1; m++)
        quant_row_blocks(f->x + m * K, (int8_t *)ws + m * K, xa + m * KB, xr + m * KB, K, f->B);
}

/* the driver's tile: rows [m, m + mr), column groups [g, g + ng), all of k */
static void tile_fp4(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                     int flags) {
    const fp4_args *a = args;
    const int64_t KB = a->K / a->B, gs = a->K / 8 * QT_NC, ss = KB * QT_NC;
    const float *xa = (const float *)((const uint8_t *)ws + fp4_a_offset(a));
    const int32_t *xr = (const int32_t *)((const uint8_t *)ws + fp4_r_offset(a));
    const ukr_fp4_fn f = ng == 2 ? UKRS_FP4_WIDE[a->B == 32] : UKRS_FP4[a->B == 32][mr];
    (void)k0; (void)kc; (void)flags;
    f(a->p + g * gs, gs, a->s + g * ss, ss, a->c, (const int8_t *)ws + m * a->K, a->K, xa + m * KB, xr + m * KB, KB,
      a->y + m * a->N, g * QT_NC, a->N, KB);
}
#endif

/* p: ridgeline_pack_i4's layout of the E2M1 codes; s: header + block scales as above; B 32 (MXFP4:
 * E8M0 scales) or 16 (NVFP4: E4M3 scales); K a multiple of B */
int ridgeline_gemm_fp4(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N,
                       int64_t K, int64_t B, int nthreads) {
#if FP4_ISA
    if (M < 1 || N < 1 || K < 1 || (B != 16 && B != 32) || K % B) return -1;
    float c;
    memcpy(&c, s, sizeof c);
    const fp4_args a = {p, s + FP4_HEADER, c, x, y, M, N, K, B};
    const td_plan plan = {.M = M, .groups = (N + QT_NC - 1) / QT_NC, .K = K, .KC = K,
                          .rows = qt_chunk_rows(K, 1, FP4_MR), .mr = FP4_MR, .wide = 1,
                          .ws_bytes = fp4_r_offset(&a) + (size_t)(M * (K / B)) * sizeof(int32_t),
                          .own_rows = TD_OWN_ROWS, .cols = QT_NC};
    return ridgeline_td_run(&plan, &a, prep_fp4, tile_fp4, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)B; (void)nthreads;
    return -2;
#endif
}
