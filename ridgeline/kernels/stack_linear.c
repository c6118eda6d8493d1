/* One linear layer of the decoder stack by its weight descriptor [format, data, scale, bias]: the
 * matmul kernel the format's row of formats.h names, then the bias. decoder_stack.c and moe.c (expert
 * and router matmuls) both call it, so every format runs the same code wherever a layer sits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "formats.h"
#include "quant_tile.h"
#include "tile_driver.h"
#ifdef __AVX512F__
#include <immintrin.h>
#endif

int ridgeline_gemm_f32p(const float *p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads);
int ridgeline_gemm_bf16p(const uint16_t *p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads);
int ridgeline_packed_available(int bf16);
int ridgeline_gemm_i8p(const int8_t *p, const float *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads);
int ridgeline_gemm_i4p(const uint32_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                       int64_t K, int64_t G, int sym, int nthreads);
int ridgeline_int8_available(void);
int ridgeline_int4_available(void);
int ridgeline_gemm_w8a8(const uint8_t *p, const float *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                        int nthreads);
int ridgeline_gemm_w4a8(const uint32_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                        int64_t K, int64_t G, int sym, int nthreads);
int ridgeline_gemm_w8a8_g32(const uint8_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                            int64_t K, int nthreads);
int ridgeline_a8_available(void);
int ridgeline_gemm_fp8(const uint8_t *p, const void *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int mode, int nthreads);
int ridgeline_gemm_fp4(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N,
                       int64_t K, int64_t B, int nthreads);
int ridgeline_fp8_available(void);
int ridgeline_fp4_available(void);
int ridgeline_gemm_i8g32(const int8_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                         int64_t K, int nthreads);
int ridgeline_gemm_i6p(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads);
int ridgeline_iq4_available(void);
int ridgeline_gemm_i5k(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads);
int ridgeline_gemm_i4k(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int nthreads);
int ridgeline_gemm_kq(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                      int64_t bits, int nthreads);
int ridgeline_gemm_iq4(const uint32_t *p, const uint8_t *s, const float *x, float *y, int64_t M, int64_t N, int64_t K,
                       int64_t B, int nthreads);
int ridgeline_gemm_i5p(const uint32_t *p, const uint16_t *s, const float *x, float *y, int64_t M, int64_t N,
                       int64_t K, int sym, int nthreads);

enum { LW_FORMAT, LW_DATA, LW_SCALE, LW_BIAS, LW_FIELDS };

#define PTR(T, v) ((T *)(intptr_t)(v))

int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt);

/* y [M, N] = x W^T for a split weight (WF_SPLIT): t = [parts, then per part its columns Np and its own
 * descriptor [LW_FIELDS]], the parts' columns in order summing to N. Each part runs its own format's kernel on
 * its Np columns, so a column's value is what that kernel gives for that part alone; one row writes y in
 * place, more rows go through a scratch [M, Np] copied into y's columns. -2: a malformed table (a part that is
 * itself split, columns that do not add up to N), -1: no scratch. */
static int split_linear(const int64_t *t, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt) {
    const int64_t parts = t[0];
    int64_t widest = 0, total = 0;
    for (int64_t p = 0; p < parts; p++) {
        const int64_t *part = t + 1 + p * (1 + LW_FIELDS);
        const weight_code *c = weight_code_of(part[1 + LW_FORMAT]);
        if (part[0] <= 0 || !c || c->kernel == WK_SPLIT || part[1 + LW_BIAS]) return -2;
        widest = part[0] > widest ? part[0] : widest;
        total += part[0];
    }
    if (parts <= 0 || total != N) return -2;
    float *tmp = M > 1 ? malloc((size_t)(M * widest) * sizeof *tmp) : NULL;
    if (M > 1 && !tmp) return -1;
    int rc = 0;
    for (int64_t p = 0, n0 = 0; p < parts; p++) {
        const int64_t *part = t + 1 + p * (1 + LW_FIELDS), Np = part[0];
        rc |= ridgeline_stack_linear(part + 1, x, M > 1 ? tmp : y + n0, M, Np, K, nt);
        for (int64_t m = 0; M > 1 && m < M; m++)
            for (int64_t n = 0; n < Np; n++) y[m * N + n0 + n] = tmp[m * Np + n];
        n0 += Np;
    }
    free(tmp);
    return rc;
}

/* 1 if this build runs that weight format on this CPU (codes: formats.h, generated from
 * ridgeline/kernels/formats.py) */
int ridgeline_stack_weight_format(int64_t format) {
    const weight_code *c = weight_code_of(format);
    switch (c ? c->kernel : WK_NONE) {
    case WK_F32: return ridgeline_packed_available(0);
    case WK_BF16: return ridgeline_packed_available(1);
    case WK_I8: case WK_I8G32: return ridgeline_int8_available();
    case WK_I4: case WK_I5: case WK_I6: case WK_KQ: case WK_I4K: case WK_I5K: return ridgeline_int4_available();
    case WK_W8A8: case WK_W8A8G32: case WK_W4A8: return ridgeline_a8_available();
    case WK_FP8: return ridgeline_fp8_available();
    case WK_FP4: return ridgeline_fp4_available();
    case WK_IQ4: return ridgeline_iq4_available();
    case WK_SPLIT: return 1; /* its parts' formats are checked where the table is built */
    default: return 0;
    }
}

/* y [M, N] = x [M, K] W^T (+ bias) by descriptor w [LW_FIELDS]: the kernel its format's row names,
 * with that row's parameter */
int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt) {
    const weight_code *c = weight_code_of(w[LW_FORMAT]);
    const int64_t d = w[LW_DATA], s = w[LW_SCALE];
    int rc;
    switch (c ? c->kernel : WK_NONE) {
    case WK_F32: rc = ridgeline_gemm_f32p(PTR(const float, d), x, y, M, N, K, nt); break;
    case WK_BF16: rc = ridgeline_gemm_bf16p(PTR(const uint16_t, d), x, y, M, N, K, nt); break;
    case WK_I8: rc = ridgeline_gemm_i8p(PTR(const int8_t, d), PTR(const float, s), x, y, M, N, K, nt); break;
    case WK_I8G32: rc = ridgeline_gemm_i8g32(PTR(const int8_t, d), PTR(const uint16_t, s), x, y, M, N, K, nt); break;
    case WK_I4:
        rc = ridgeline_gemm_i4p(PTR(const uint32_t, d), PTR(const uint16_t, s), x, y, M, N, K, c->param, c->sym, nt);
        break;
    case WK_I5: /* data: three k pairs a word [groups][ceil(K/6)][NC] (gemm_int5.c) */
        rc = ridgeline_gemm_i5p(PTR(const uint32_t, d), PTR(const uint16_t, s), x, y, M, N, K, c->sym, nt);
        break;
    case WK_I6: /* data: eight k pairs in three words; scale: int8 per 16 k, then fp16 per 256 (gemm_int6.c) */
        rc = ridgeline_gemm_i6p(PTR(const uint32_t, d), PTR(const uint8_t, s), x, y, M, N, K, nt);
        break;
    case WK_IQ4: /* data: the codes; scale: fp16 per 32 k, or int8 per 32 then fp16 per 256 (gemm_iq4.c) */
        rc = ridgeline_gemm_iq4(PTR(const uint32_t, d), PTR(const uint8_t, s), x, y, M, N, K, c->param, nt);
        break;
    case WK_I4K: /* data: int4's nibbles; scale: byte scale and minimum per 32 k, then fp16 per 256 (gemm_int4.c) */
        rc = ridgeline_gemm_i4k(PTR(const uint32_t, d), PTR(const uint8_t, s), x, y, M, N, K, nt);
        break;
    case WK_I5K: /* data: int5's words; scale: as WK_I4K's (gemm_int5.c) */
        rc = ridgeline_gemm_i5k(PTR(const uint32_t, d), PTR(const uint8_t, s), x, y, M, N, K, nt);
        break;
    case WK_KQ: /* data: the 2-bit planes, then (Q3_K) the third bits; scale: bytes per 16 k, then fp16 (gemm_kq.c) */
        rc = ridgeline_gemm_kq(PTR(const uint32_t, d), PTR(const uint8_t, s), x, y, M, N, K, c->param, nt);
        break;
    case WK_W8A8: rc = ridgeline_gemm_w8a8(PTR(const uint8_t, d), PTR(const float, s), x, y, M, N, K, nt); break;
    case WK_W8A8G32:
        rc = ridgeline_gemm_w8a8_g32(PTR(const uint8_t, d), PTR(const uint16_t, s), x, y, M, N, K, nt);
        break;
    case WK_W4A8:
        rc = ridgeline_gemm_w4a8(PTR(const uint32_t, d), PTR(const uint16_t, s), x, y, M, N, K, c->param, c->sym, nt);
        break;
    case WK_FP8: rc = ridgeline_gemm_fp8(PTR(const uint8_t, d), PTR(const void, s), x, y, M, N, K, c->param, nt); break;
    case WK_FP4:
        rc = ridgeline_gemm_fp4(PTR(const uint32_t, d), PTR(const uint8_t, s), x, y, M, N, K, c->param, nt);
        break;
    case WK_SPLIT: rc = split_linear(PTR(const int64_t, d), x, y, M, N, K, nt); break;
    default: return -2;
    }
    if (w[LW_BIAS]) {
        const float *b = PTR(const float, w[LW_BIAS]);
        for (int64_t t = 0; t < M; t++)
            for (int64_t n = 0; n < N; n++) y[t * N + n] += b[n];
    }
    return rc;
}

/* The index of r [n]'s largest value, the first on ties and the first NaN if it has one (torch.argmax's
 * answer): the largest value found first, then its first position. */
static int64_t argmax_row(const float *r, int64_t n) {
    int64_t i = 0;
    float mx = r[0];
#ifdef __AVX512F__
    if (n >= 16) {
        __m512 vm = _mm512_loadu_ps(r);
        __mmask16 nan = _mm512_cmp_ps_mask(vm, vm, _CMP_UNORD_Q);
        for (i = 16; i + 16 <= n; i += 16) {
            const __m512 v = _mm512_loadu_ps(r + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            vm = _mm512_max_ps(vm, v);
        }
        if (nan) i = 0; /* the scalar scan below finds the first NaN */
        else mx = _mm512_reduce_max_ps(vm);
    }
#endif
    for (; i < n; i++) {
        if (r[i] != r[i]) return i;
        if (r[i] > mx) mx = r[i];
    }
    for (i = 0; i < n; i++)
        if (r[i] == mx) return i;
    return 0;
}

/* The argmax of r [n] with every token bits [ceil(n / 32)] forbids set to -inf first, as torch.argmax picks it on
 * the masked row (the first allowed NaN; else the first allowed maximum; 0 when that maximum is -inf, as every
 * entry of the masked row then is), without writing the row: a masked maximum over 16-lane chunks (a forbidden
 * lane stays -inf), then the first allowed position that holds it. Bit t % 32 of bits[t / 32]: t allowed. */
static int64_t masked_argmax_row(const float *r, int64_t n, const uint32_t *bits) {
    float mx = -INFINITY;
    int nan = 0;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 vm = _mm512_set1_ps(-INFINITY);
    __mmask16 seen = 0;
    for (; i + 16 <= n; i += 16) {
        const __mmask16 ok = (__mmask16)(bits[i >> 5] >> (i & 16));
        if (!ok) continue;
        const __m512 v = _mm512_maskz_loadu_ps(ok, r + i);
        seen |= _mm512_mask_cmp_ps_mask(ok, v, v, _CMP_UNORD_Q);
        vm = _mm512_mask_max_ps(vm, ok, vm, v);
    }
    nan = seen != 0;
    mx = _mm512_reduce_max_ps(vm);
#endif
    for (; i < n; i++) {
        if (!(bits[i >> 5] >> (i & 31) & 1u)) continue;
        if (r[i] != r[i]) nan = 1;
        else if (r[i] > mx) mx = r[i];
    }
    if (!nan && mx == -INFINITY) return 0;
    for (int64_t w = 0; w * 32 < n; w++) {
        for (uint32_t b = bits[w]; b; b &= b - 1) {
            const int64_t t = w * 32 + __builtin_ctz(b);
            if (t >= n) break;
            if (nan ? r[t] != r[t] : r[t] == mx) return t;
        }
    }
    return 0;
}

/* The columns a masked head must compute: NULL when a row is unmasked (it needs them all), else the union
 * of the rows' masks [words]: a row's own mask when every row has the same one, else *own (the caller
 * frees it; NULL, and no filter, if it cannot be allocated). */
static const uint32_t *head_columns(const uint32_t *masks, const int64_t *mask_of, int64_t M, int64_t words,
                                    uint32_t **own) {
    *own = NULL;
    int same = 1;
    for (int64_t m = 0; m < M; m++) {
        if (mask_of[m] < 0) return NULL;
        same &= mask_of[m] == mask_of[0];
    }
    if (same) return masks + mask_of[0] * words;
    if (!(*own = malloc((size_t)words * sizeof **own))) return NULL;
    for (int64_t i = 0; i < words; i++) (*own)[i] = 0;
    for (int64_t m = 0; m < M; m++) {
        const uint32_t *b = masks + mask_of[m] * words;
        for (int64_t i = 0; i < words; i++) (*own)[i] |= b[i];
    }
    return *own;
}

/* y [M, N] = x W^T by descriptor w (ridgeline_stack_linear), then ids [M]: each row's argmax_row; a
 * greedy LM head and its choice in one call. masks: NULL, or per row mask_of[m] (-1: none) names the row of
 * masks [*, ceil(N / 32)] (allowed-token bitmasks) whose masked argmax row m takes (masked_argmax_row).
 * When every row has a mask, the matmul computes only the column groups holding a token some row allows
 * (ridgeline_td_filter): y then holds those groups' logits, each bitwise the full head's (every allowed
 * token's among them), and is unwritten elsewhere but for the bias; the argmax reads allowed tokens only.
 * full: compute every column anyway (the same ids; for measuring what the filter saves). */
int ridgeline_linear_argmax(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int64_t *ids,
                            const uint32_t *masks, const int64_t *mask_of, int full, int nt) {
    const int64_t words = (N + 31) / 32;
    uint32_t *own = NULL;
    const weight_code *c = weight_code_of(w[LW_FORMAT]);
    full |= c && c->kernel == WK_SPLIT; /* the filter names columns of one kernel's call, not of its parts' */
    ridgeline_td_filter(masks && M > 0 && !full ? head_columns(masks, mask_of, M, words, &own) : NULL, N);
    const int rc = ridgeline_stack_linear(w, x, y, M, N, K, nt);
    ridgeline_td_filter(NULL, 0); /* a kernel that returned before the driver leaves it set */
    free(own);
    if (rc) return rc;
    for (int64_t m = 0; m < M; m++)
        ids[m] = masks && mask_of[m] >= 0 ? masked_argmax_row(y + m * N, N, masks + mask_of[m] * words)
                                          : argmax_row(y + m * N, N);
    return 0;
}
