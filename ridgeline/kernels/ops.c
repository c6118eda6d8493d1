/* Fused element-wise steps of a decoder layer on fp32 activations, one pass over memory each, where
 * torch on a CPU spends several small ops (and their dispatch) per step:
 *   rmsnorm:  residual += x (optional), out = residual / rms(residual) * w
 *   silu_mul: out[t, i] = silu(gu[t, i]) * gu[t, I + i]
 *   gelu_tanh_mul: out[t, i] = gelu_tanh(gu[t, i]) * gu[t, I + i] (Gemma)
 *   swiglu_clamp_mul: g = min(gu[t, i], limit), u = clamp(gu[t, I + i], -limit, limit),
 *             out[t, i] = g sigmoid(alpha g) (u + 1) (GPT-OSS's experts)
 *   qk_norm:  per-head RMSNorm of the q and k heads inside the fused qkv rows, in place (Qwen3)
 *   rope_kv:  rotate q and k inside the fused qkv rows (interleaved pairs), write k and v into the
 *             paged KV cache at their slots, in its formats (kv_quant.h: fp32, bf16, fp16, int8, int4,
 *             fp8), quantizing on the way. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "kv_quant.h"
#ifdef __AVX512F__
#include "vexp.h"
#endif

int ridgeline_rmsnorm(const float *x, float *residual, const float *w, float *out, int64_t T, int64_t H,
                      float eps, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) if (T * H >= 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * H;
        float *src = (float *)xt;
        if (residual) {
            float *rt = residual + t * H;
            #pragma omp simd
            for (int64_t i = 0; i < H; i++) rt[i] += xt[i];
            src = rt;
        }
        float ss = 0.f;
        #pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < H; i++) ss += src[i] * src[i];
        const float inv = 1.f / sqrtf(ss / (float)H + eps);
        float *ot = out + t * H;
        #pragma omp simd
        for (int64_t i = 0; i < H; i++) ot[i] = src[i] * inv * w[i];
    }
    return 0;
}

/* out[t, i] = g sigmoid(a) * u, g and u the two halves of gu's row t: a = g is SiLU; a = 2 sqrt(2 / pi) (g +
 * 0.044715 g^3) makes g sigmoid(a) exactly GELU's tanh approximation 0.5 g (1 + tanh(a / 2)) (Gemma); GPT-OSS's
 * clamped SwiGLU takes g = min(g, limit), a = alpha g and u = clamp(u, -limit, limit) + 1, in the order
 * transformers computes it. One exp per element and no overflow (exp -> inf gives 0, exp -> 0 gives g). */
#define GELU_2C 1.5957691216057308f /* 2 sqrt(2 / pi) */
enum { GATE_SILU, GATE_GELU_TANH, GATE_SWIGLU_CLAMP };
static int gated_mul(const float *gu, float *out, int64_t T, int64_t I, int kind, float alpha, float limit,
                     int nthreads) {
    const int gelu = kind == GATE_GELU_TANH, clamp = kind == GATE_SWIGLU_CLAMP;
    #pragma omp parallel for num_threads(nthreads) if (T * I >= 65536)
    for (int64_t t = 0; t < T; t++) {
        const float *g = gu + t * 2 * I, *u = g + I;
        float *o = out + t * I;
        int64_t i = 0;
#ifdef __AVX512F__
        const __m512 one = _mm512_set1_ps(1.f), c = _mm512_set1_ps(-GELU_2C), k = _mm512_set1_ps(0.044715f);
        const __m512 lim = _mm512_set1_ps(limit), nlim = _mm512_set1_ps(-limit), na = _mm512_set1_ps(-alpha);
        for (; i + 16 <= I; i += 16) {
            __m512 gv = _mm512_loadu_ps(g + i), uv = _mm512_loadu_ps(u + i);
            if (clamp) {
                gv = _mm512_min_ps(gv, lim);
                uv = _mm512_add_ps(_mm512_max_ps(_mm512_min_ps(uv, lim), nlim), one);
            }
            const __m512 z = gelu    ? _mm512_mul_ps(c, _mm512_fmadd_ps(_mm512_mul_ps(k, gv), _mm512_mul_ps(gv, gv), gv))
                             : clamp ? _mm512_mul_ps(na, gv)
                                     : _mm512_sub_ps(_mm512_setzero_ps(), gv);
            _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(one, vexp512(z))), uv));
        }
#endif
        for (; i < I; i++) {
            float x = g[i], y = u[i];
            if (clamp) x = x < limit ? x : limit, y = (y < limit ? (y > -limit ? y : -limit) : limit) + 1.f;
            o[i] = x / (1.f + expf(gelu ? -GELU_2C * (x + 0.044715f * x * x * x) : clamp ? -alpha * x : -x)) * y;
        }
    }
    return 0;
}

int ridgeline_silu_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads) {
    return gated_mul(gu, out, T, I, GATE_SILU, 1.f, 0.f, nthreads);
}

int ridgeline_gelu_tanh_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads) {
    return gated_mul(gu, out, T, I, GATE_GELU_TANH, 1.f, 0.f, nthreads);
}

int ridgeline_swiglu_clamp_mul(const float *gu, float *out, int64_t T, int64_t I, float alpha, float limit,
                               int nthreads) {
    return gated_mul(gu, out, T, I, GATE_SWIGLU_CLAMP, alpha, limit, nthreads);
}

/* qkv [T, (H + 2 Hkv) D]: each of the H q heads normed with qw [D], each of the Hkv k heads with kw [D],
 * in place, the same arithmetic as ridgeline_rmsnorm on one [D] row */
int ridgeline_qk_norm(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const float *qw, const float *kw,
                      float eps, int nthreads) {
    const int64_t width = (H + 2 * Hkv) * D;
    #pragma omp parallel for num_threads(nthreads) if (T * width >= 65536)
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H + Hkv; h++) {
            float *x = qkv + t * width + h * D;
            const float *w = h < H ? qw : kw;
            float ss = 0.f;
            #pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < D; i++) ss += x[i] * x[i];
            const float inv = 1.f / sqrtf(ss / (float)D + eps);
            #pragma omp simd
            for (int64_t i = 0; i < D; i++) x[i] = x[i] * inv * w[i];
        }
    }
    return 0;
}

/* K or V rows [Hkv, D] of one token into its cache slot, in format f (rows of fp32/bf16 in one pass) */
static inline void store_rows(int f, void *cache, uint16_t *scales, int64_t slot, const float *x, int64_t Hkv,
                              int64_t D) {
    const int64_t n = Hkv * D;
    if (f == KV_F32) {
        memcpy((float *)cache + slot * n, x, sizeof(float) * (size_t)n);
    } else if (f == KV_BF16) {
        uint16_t *d = (uint16_t *)cache + slot * n;
        for (int64_t i = 0; i < n; i++) d[i] = kv_f32_to_bf16(x[i]);
    } else {
        const int64_t vb = kv_vec_bytes(f, D), ns = kv_vec_scales(f, D);
        for (int64_t h = 0; h < Hkv; h++)
            kv_store(f, (char *)cache + (slot * Hkv + h) * vb, scales ? scales + (slot * Hkv + h) * ns : NULL,
                     x + h * D, D);
    }
}

/* qkv [T, (H + 2 Hkv) D] fp32 (q rotated in place); cs [P, D/2, 2] (cos, sin); slots [T] into the
 * caches viewed as [NB * bs, Hkv, vector]; kv_formats = K format | V format << 8 (kv_quant.h), with
 * fp16 scale arrays [NB * bs, Hkv, scales per vector] for quantized ones. kshift: NULL, or [2, Hkv, D]:
 * row 0 subtracted from each rotary-rotated k before it is stored (a constant per head and channel: every
 * score of a query moves by the same q.kshift, which softmax ignores; the k rows in qkv keep it
 * subtracted), row 1 instead from the k at position 0 (the attention sink, whose key is far from the
 * others': the attention kernels add the difference back, paged_src.h k0off). Returns -1 for an unknown
 * format. */
int ridgeline_rope_kv(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const int64_t *positions,
                      const float *cs, const int64_t *slots, void *kc, void *vc, uint16_t *ksc, uint16_t *vsc,
                      int kv_formats, const float *kshift, int nthreads) {
    const int kf = kv_formats & 0xff, vf = kv_formats >> 8;
    if (!kv_known(kf) || !kv_known(vf)) return -1;
    const int64_t width = (H + 2 * Hkv) * D, half = D / 2;
    #pragma omp parallel for num_threads(nthreads) if (T >= 64)
    for (int64_t t = 0; t < T; t++) {
        float *row = qkv + t * width;
        const float *c = cs + positions[t] * D;
        for (int64_t h = 0; h < H + Hkv; h++) { /* q heads, then k heads */
            float *x = row + h * D;
            #pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = x[2 * i], b = x[2 * i + 1], co = c[2 * i], si = c[2 * i + 1];
                x[2 * i] = a * co - b * si;
                x[2 * i + 1] = a * si + b * co;
            }
        }
        float *k = row + H * D;
        const float *v = k + Hkv * D;
        if (kshift) {
            const float *c = kshift + (positions[t] == 0 ? Hkv * D : 0);
            for (int64_t i = 0; i < Hkv * D; i++) k[i] -= c[i];
        }
        store_rows(kf, kc, ksc, slots[t], k, Hkv, D);
        store_rows(vf, vc, vsc, slots[t], v, Hkv, D);
    }
    return 0;
}

/* out [T, H] fp32 = rows ids [T] of table [V, H] in format fmt (KV_F32, KV_BF16 or KV_F16: kv_quant.h), the
 * embedding lookup as torch computes it (each value converted exactly). Returns -1 for an id outside
 * [0, V) or another format, writing nothing. */
int ridgeline_embed(const void *table, int fmt, const int64_t *ids, int64_t T, int64_t V, int64_t H, float *out) {
    if (fmt != KV_F32 && fmt != KV_BF16 && fmt != KV_F16) return -1;
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= V) return -1;
    for (int64_t t = 0; t < T; t++) {
        float *o = out + t * H;
        if (fmt == KV_F32) {
            memcpy(o, (const float *)table + ids[t] * H, sizeof(float) * (size_t)H);
        } else if (fmt == KV_BF16) {
            const uint16_t *r = (const uint16_t *)table + ids[t] * H;
            for (int64_t i = 0; i < H; i++) o[i] = kv_bf16_to_f32(r[i]);
        } else {
            const uint16_t *r = (const uint16_t *)table + ids[t] * H;
            for (int64_t i = 0; i < H; i++) o[i] = kv_f16_to_f32(r[i]);
        }
    }
    return 0;
}
