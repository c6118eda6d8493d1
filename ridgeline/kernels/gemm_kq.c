/* y[M, N] = x[M, K] @ W^T for GGUF's 2- and 3-bit K-quants, values and scales as the file stores them, fp32
 * x and y (weight-only: x is not quantized). Per 256 k one fp16 D (and for Q2_K one fp16 Dmin); per 16 k:
 *   Q3_K: w = D * s * (q - 4), q in [0, 7], s one int8 (its 6-bit scale minus 32)
 *   Q2_K: w = D * (c & 15) * q - Dmin * (c >> 4), q in [0, 3], c one byte (4-bit scale, 4-bit minimum)
 * K is a multiple of 256. Layout (data):
 *   C[g][k/16][NC] uint32: q's low 2 bits, as gemm_int6.c's high bit pairs (ridgeline_pack_i6_high)
 *   H[g][k/32][NC] uint32: Q3_K's third bit (q >> 2), as gemm_int5.c's high bits (ridgeline_pack_i5_high)
 * scale: [g][k/16][NC] bytes (s or c), then [g][k/256][NC] fp16 D, then (Q2_K) [g][k/256][NC] fp16 Dmin.
 * The bits and a bf16 exponent are masked together (vpternlogd) so each 16-bit half reads 8 + q (Q3_K) or
 * 4 + q (Q2_K) exactly: a vdpbf16ps operand. x is rounded to bf16 as for the int4 kernel; per group of 16,
 * S = sum x (z + q) and X = sum x give sum x w = D s (S - 12 X) (Q3_K) and D (c & 15) (S - 4 X) - Dmin
 * (c >> 4) X (Q2_K), the scale products formed in fp32 (exact). Per group the partial S starts from zero and
 * folds into fp32 sums; an output's arithmetic does not depend on M or on the tile shape (a lone row takes
 * two column groups at once), so a row's result does not depend on its batch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_grid.h"

#define KQG 16  /* k per sub-block scale */
#define KQD 256 /* k per super-block scale */

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define KQ_MR 4

/* pair j of the crumb word (Cs[v], shifted right by 8 o) and, for Q3_K, of the high-bit word (Hs[v], shifted
 * right by 4 o') against every row */
#define KQ_PAIR(j, C2, C3, H3) \
    for (int v = 0; v < nv; v++) { \
        __m512i wq; \
        if (bits == 2) \
            wq = _mm512_ternarylogic_epi32(C2, crumb2, magic2, 0xEA); /* (c & mask) | magic */ \
        else \
            wq = _mm512_ternarylogic_epi32(H3, top3, _mm512_ternarylogic_epi32(C3, crumb3, magic3, 0xEA), 0xEA); \
        for (int i = 0; i < mr; i++) { \
            int32_t pair; \
            memcpy(&pair, xg + i * ldx + 8 * o + 2 * (j), 4); \
            S[i][v] = _mm512_dpbf16_ps(S[i][v], (__m512bh)_mm512_set1_epi32(pair), (__m512bh)wq); \
        } \
    }

#define KQ_OCTET(O) \
    { \
        const int o = (O); \
        __m512i Cs[2 * QT_NR], Hs[2 * QT_NR]; \
        for (int v = 0; v < nv; v++) { \
            Cs[v] = _mm512_srli_epi32(Cb[v], 8 * (O)); \
            Hs[v] = bits == 3 ? _mm512_srli_epi32(Hb[v], 4 * (2 * sub + (O))) : Cs[v]; \
        } \
        KQ_PAIR(0, _mm512_slli_epi32(Cs[v], 5), _mm512_slli_epi32(Cs[v], 4), _mm512_slli_epi32(Hs[v], 6)) \
        KQ_PAIR(1, _mm512_slli_epi32(Cs[v], 3), _mm512_slli_epi32(Cs[v], 2), _mm512_slli_epi32(Hs[v], 5)) \
        KQ_PAIR(2, _mm512_slli_epi32(Cs[v], 1), Cs[v], _mm512_slli_epi32(Hs[v], 4)) \
        KQ_PAIR(3, _mm512_srli_epi32(Cs[v], 1), _mm512_srli_epi32(Cs[v], 2), _mm512_slli_epi32(Hs[v], 3)) \
    }

/* mr rows of xb (bf16, stride ldx) and their group sums xs (stride ldxs) against ng (1 or 2) consecutive column
 * groups (crumb stride cs words, high-bit stride hs words, byte-scale stride ss, D / Dmin stride sd halves),
 * kg groups of 16 from this block's start (a multiple of 256) -> y rows at columns n0.. */
static inline __attribute__((always_inline)) void
ukr_kq(const int mr, const int ng, const int bits, const uint32_t *pc, int64_t cs, const uint32_t *ph, int64_t hs,
       const uint8_t *sb, int64_t ss, const uint16_t *dd, const uint16_t *dm, int64_t sd, const uint16_t *xb,
       int64_t ldx, const float *xs, int64_t ldxs, float *y, int64_t n0, int64_t N, int64_t kg, int flags) {
    const __m512i crumb2 = _mm512_set1_epi32(0x00600060), magic2 = _mm512_set1_epi32(0x40804080),
                  crumb3 = _mm512_set1_epi32(0x00300030), top3 = _mm512_set1_epi32(0x00400040),
                  magic3 = _mm512_set1_epi32(0x41004100);
    const int nv = ng * QT_NR;
    __m512 acc[KQ_MR][2 * QT_NR];
    qt_start(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N, flags);
    for (int64_t u = 0; u < kg / 2; u++) {
        __m512i Hb[2 * QT_NR];
        for (int v = 0; v < nv; v++)
            Hb[v] = bits == 3 ? _mm512_loadu_si512(ph + (v / QT_NR) * hs + u * QT_NC + 16 * (v % QT_NR))
                              : _mm512_setzero_si512();
        for (int sub = 0; sub < 2; sub++) {
            const int64_t b = 2 * u + sub;
            __m512 S[KQ_MR][2 * QT_NR];
            __m512i Cb[2 * QT_NR];
            for (int i = 0; i < mr; i++)
                for (int v = 0; v < nv; v++) S[i][v] = _mm512_setzero_ps();
            for (int c = 0; c < ng; c++) w_prefetch(pc + c * cs + b * QT_NC, QT_NR, mr);
            for (int v = 0; v < nv; v++) Cb[v] = _mm512_loadu_si512(pc + (v / QT_NR) * cs + b * QT_NC + 16 * (v % QT_NR));
            const uint16_t *xg = xb + b * KQG;
            KQ_OCTET(0) KQ_OCTET(1)
            for (int v = 0; v < nv; v++) {
                const int64_t col = 16 * (v % QT_NR), at = (v / QT_NR) * sd + b / (KQD / KQG) * QT_NC + col;
                const __m128i sv = _mm_loadu_si128((const __m128i *)(sb + (v / QT_NR) * ss + b * QT_NC + col));
                const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dd + at)));
                __m512 scale, off;
                if (bits == 3) {
                    scale = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sv)));
                    off = _mm512_mul_ps(scale, _mm512_set1_ps(-12.f));
                } else {
                    const __m512i c = _mm512_cvtepu8_epi32(sv);
                    const __m512 Dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dm + at)));
                    scale = _mm512_mul_ps(D, _mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(15))));
                    const __m512 mn = _mm512_mul_ps(Dm, _mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4)));
                    off = _mm512_fmadd_ps(scale, _mm512_set1_ps(-4.f), _mm512_sub_ps(_mm512_setzero_ps(), mn));
                }
                for (int i = 0; i < mr; i++) {
                    acc[i][v] = _mm512_fmadd_ps(S[i][v], scale, acc[i][v]);
                    acc[i][v] = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * ldxs + b]), off, acc[i][v]);
                }
            }
        }
    }
    qt_store(mr, nv, 2 * QT_NR, &acc[0][0], y, n0, N);
}

typedef void (*ukr_kq_fn)(const uint32_t *, int64_t, const uint32_t *, int64_t, const uint8_t *, int64_t,
                          const uint16_t *, const uint16_t *, int64_t, const uint16_t *, int64_t, const float *,
                          int64_t, float *, int64_t, int64_t, int64_t, int);
#define UKR_KQ(R, NG, BITS) \
    static void ukr_kq_##R##_##NG##_##BITS(const uint32_t *pc, int64_t cs, const uint32_t *ph, int64_t hs, \
                                           const uint8_t *sb, int64_t ss, const uint16_t *dd, const uint16_t *dm, \
                                           int64_t sd, const uint16_t *xb, int64_t ldx, const float *xs, \
                                           int64_t ldxs, float *y, int64_t n0, int64_t N, int64_t kg, int flags) { \
        ukr_kq(R, NG, BITS, pc, cs, ph, hs, sb, ss, dd, dm, sd, xb, ldx, xs, ldxs, y, n0, N, kg, flags); \
    }
UKR_KQ(1, 2, 2) UKR_KQ(1, 1, 2) UKR_KQ(2, 1, 2) UKR_KQ(3, 1, 2) UKR_KQ(4, 1, 2)
UKR_KQ(1, 2, 3) UKR_KQ(1, 1, 3) UKR_KQ(2, 1, 3) UKR_KQ(3, 1, 3) UKR_KQ(4, 1, 3)
static const ukr_kq_fn UKRS_KQ[2][KQ_MR + 1] = {{0, ukr_kq_1_1_2, ukr_kq_2_1_2, ukr_kq_3_1_2, ukr_kq_4_1_2},
                                               {0, ukr_kq_1_1_3, ukr_kq_2_1_3, ukr_kq_3_1_3, ukr_kq_4_1_3}};
static const ukr_kq_fn UKRS_KQ_WIDE[2] = {ukr_kq_1_2_2, ukr_kq_1_2_3};

typedef struct {
    const uint32_t *c, *h;
    const uint8_t *s;
    const uint16_t *d, *dm;
    const float *x;
    float *y;
    int64_t M, N, K;
    int bits;
} kq_args;

/* the prepared x: xb [M][K] bf16, then xs [M][K/16] fp32 */
static inline float *kq_sums(const kq_args *a, const void *ws) {
    return (float *)((uint16_t *)ws + a->M * a->K);
}

static void tile_kq(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0, int64_t kc,
                    int flags) {
    const kq_args *a = args;
    const int64_t KG = a->K / KQG, cs = KG * QT_NC, hs = a->K / 32 * QT_NC, sd = a->K / KQD * QT_NC;
    const int64_t at = g * sd + k0 / KQD * QT_NC;
    const ukr_kq_fn f = ng == 2 ? UKRS_KQ_WIDE[a->bits == 3] : UKRS_KQ[a->bits == 3][mr];
    f(a->c + g * cs + k0 / KQG * QT_NC, cs, a->h ? a->h + g * hs + k0 / 32 * QT_NC : NULL, hs,
      a->s + g * cs + k0 / KQG * QT_NC, cs, a->d + at, a->dm ? a->dm + at : NULL, sd,
      (const uint16_t *)ws + m * a->K + k0, a->K, kq_sums(a, ws) + m * KG + k0 / KQG, KG, a->y + m * a->N, g * QT_NC,
      a->N, kc / KQG, flags);
}

/* the driver's prep: rows [r0, r1) of x rounded to bf16, and each 16's sum of them */
static void prep_kq(const void *args, void *ws, int64_t r0, int64_t r1) {
    const kq_args *a = args;
    grid_prep16(a->x, (uint16_t *)ws, kq_sums(a, ws), r0, r1, a->K);
}
#endif

/* p: the crumbs, then (bits 3) the high bits; s: the byte scales, D, then (bits 2) Dmin, as above */
int ridgeline_gemm_kq(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                      int64_t bits, int nthreads) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    if (M < 1 || N < 1 || K < 1 || K % KQD || (bits != 2 && bits != 3)) return -1;
    const int64_t G = (N + QT_NC - 1) / QT_NC, KC = qt_k_block(M, K, 2, KQD);
    const uint16_t *d = (const uint16_t *)(s + G * (K / KQG) * QT_NC);
    const kq_args a = {p, bits == 3 ? p + G * (K / KQG) * QT_NC : NULL, s, d,
                       bits == 2 ? d + G * (K / KQD) * QT_NC : NULL, x, y, M, N, K, (int)bits};
    const td_plan plan = grid_plan(M, N, K, KC, KQ_MR, KQG);
    return ridgeline_td_run(&plan, &a, prep_kq, tile_kq, nthreads);
#else
    (void)p; (void)s; (void)x; (void)y; (void)M; (void)N; (void)K; (void)bits; (void)nthreads;
    return -2;
#endif
}
