/* One linear layer of the decoder stack by its weight descriptor [format, data, scale, bias]: the
 * matmul kernel the format names, then the bias. decoder_stack.c and moe.c (expert and router
 * matmuls) both call it, so every format runs the same code wherever a layer sits. */
#include <stdint.h>
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

/* WF_I4_G32..WF_I4_LAST: group-wise int4, groups of 32 << (f - WF_I4_G32) % 3, symmetric from
 * WF_I4_SYM_G32 (kernels/cpu_quant.py int4_code); WF_W4A8_G32..WF_W4A8_LAST the same with int8
 * activations (gemm_a8.c), WF_W8A8 int8 weights with int8 activations. WF_FP8_E4M3..WF_MXFP8: fp8
 * weights (gemm_fp8.c, in its mode order); WF_MXFP4, WF_NVFP4: fp4 weights, int8 activations (gemm_fp4.c);
 * WF_I8_G32 int8 with an fp16 scale per 32 k (GGUF Q8_0's grid, gemm_int8_g32.c), WF_W8A8_G32 the same
 * grid with int8 activations (gemm_a8.c) */
enum weight_format { WF_F32_PACKED = 1, WF_BF16_PACKED = 2, WF_I8_PACKED = 3, WF_I4_G32 = 4, WF_I4_SYM_G32 = 7,
                     WF_I4_LAST = 9, WF_W8A8 = 10, WF_W4A8_G32 = 11, WF_W4A8_SYM_G32 = 14, WF_W4A8_LAST = 16,
                     WF_FP8_E4M3 = 40, WF_FP8_E5M2 = 41, WF_MXFP8 = 42, WF_MXFP4 = 43, WF_NVFP4 = 44,
                     WF_I8_G32 = 45, WF_W8A8_G32 = 46 };
enum { LW_FORMAT, LW_DATA, LW_SCALE, LW_BIAS, LW_FIELDS };

#define PTR(T, v) ((T *)(intptr_t)(v))

/* 1 if this build runs that weight format on this CPU */
int ridgeline_stack_weight_format(int64_t format) {
    if (format == WF_F32_PACKED) return ridgeline_packed_available(0);
    if (format == WF_BF16_PACKED) return ridgeline_packed_available(1);
    if (format == WF_I8_PACKED || format == WF_I8_G32) return ridgeline_int8_available();
    if (format >= WF_I4_G32 && format <= WF_I4_LAST) return ridgeline_int4_available();
    if ((format >= WF_W8A8 && format <= WF_W4A8_LAST) || format == WF_W8A8_G32) return ridgeline_a8_available();
    if (format >= WF_FP8_E4M3 && format <= WF_MXFP8) return ridgeline_fp8_available();
    if (format == WF_MXFP4 || format == WF_NVFP4) return ridgeline_fp4_available();
    return 0;
}
int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt) {
    int rc;
    switch (w[LW_FORMAT]) {
    case WF_F32_PACKED: rc = ridgeline_gemm_f32p(PTR(const float, w[LW_DATA]), x, y, M, N, K, nt); break;
    case WF_BF16_PACKED: rc = ridgeline_gemm_bf16p(PTR(const uint16_t, w[LW_DATA]), x, y, M, N, K, nt); break;
    case WF_I8_PACKED:
        rc = ridgeline_gemm_i8p(PTR(const int8_t, w[LW_DATA]), PTR(const float, w[LW_SCALE]), x, y, M, N, K, nt);
        break;
    case WF_I8_G32:
        rc = ridgeline_gemm_i8g32(PTR(const int8_t, w[LW_DATA]), PTR(const uint16_t, w[LW_SCALE]), x, y, M, N, K, nt);
        break;
    case WF_W8A8:
        rc = ridgeline_gemm_w8a8(PTR(const uint8_t, w[LW_DATA]), PTR(const float, w[LW_SCALE]), x, y, M, N, K, nt);
        break;
    case WF_W8A8_G32:
        rc = ridgeline_gemm_w8a8_g32(PTR(const uint8_t, w[LW_DATA]), PTR(const uint16_t, w[LW_SCALE]), x, y, M, N, K,
                                     nt);
        break;
    case WF_FP8_E4M3: case WF_FP8_E5M2: case WF_MXFP8:
        rc = ridgeline_gemm_fp8(PTR(const uint8_t, w[LW_DATA]), PTR(const void, w[LW_SCALE]), x, y, M, N, K,
                                (int)(w[LW_FORMAT] - WF_FP8_E4M3), nt);
        break;
    case WF_MXFP4: case WF_NVFP4:
        rc = ridgeline_gemm_fp4(PTR(const uint32_t, w[LW_DATA]), PTR(const uint8_t, w[LW_SCALE]), x, y, M, N, K,
                                w[LW_FORMAT] == WF_MXFP4 ? 32 : 16, nt);
        break;
    default:
        if (w[LW_FORMAT] >= WF_I4_G32 && w[LW_FORMAT] <= WF_I4_LAST)
            rc = ridgeline_gemm_i4p(PTR(const uint32_t, w[LW_DATA]), PTR(const uint16_t, w[LW_SCALE]), x, y, M, N, K,
                                    32 << (w[LW_FORMAT] - WF_I4_G32) % 3, w[LW_FORMAT] >= WF_I4_SYM_G32, nt);
        else if (w[LW_FORMAT] >= WF_W4A8_G32 && w[LW_FORMAT] <= WF_W4A8_LAST)
            rc = ridgeline_gemm_w4a8(PTR(const uint32_t, w[LW_DATA]), PTR(const uint16_t, w[LW_SCALE]), x, y, M, N,
                                     K, 32 << (w[LW_FORMAT] - WF_W4A8_G32) % 3, w[LW_FORMAT] >= WF_W4A8_SYM_G32, nt);
        else
            return -2;
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

/* y [M, N] = x W^T by descriptor w (ridgeline_stack_linear), then ids [M]: each row's argmax_row; a
 * greedy LM head and its choice in one call. */
int ridgeline_linear_argmax(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int64_t *ids,
                            int nt) {
    const int rc = ridgeline_stack_linear(w, x, y, M, N, K, nt);
    if (rc) return rc;
    for (int64_t m = 0; m < M; m++) ids[m] = argmax_row(y + m * N, N);
    return 0;
}
