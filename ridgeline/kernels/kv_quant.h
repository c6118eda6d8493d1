/* KV-cache formats: one (token, KV head) vector of D fp32 values stored and read back, scalar code
 * (writes are T x Hkv vectors a step; the attention kernels read with AVX-512 where they can).
 * The same arithmetic as ridgeline/formats/kv.py, bit for bit (see there for the formats):
 * x * (1 / s) with 1 / s exact, fp16 scales rounded to nearest even, round-to-nearest-even codes. */
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

enum kv_format { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2, KV_I8 = 3, KV_I4 = 4, KV_E4M3 = 5, KV_E5M2 = 6, KV_FORMATS };

static inline int kv_known(int f) { return f >= 0 && f < KV_FORMATS; }

/* data bytes and fp16 scales of one vector of D elements */
static inline int64_t kv_vec_bytes(int f, int64_t D) {
    switch (f) {
    case KV_F32: return 4 * D;
    case KV_BF16: case KV_F16: return 2 * D;
    case KV_I4: return D / 2;
    default: return D;
    }
}
static inline int64_t kv_vec_scales(int f, int64_t D) { return f == KV_I4 ? D / 32 : f >= KV_I8 ? 1 : 0; }
static inline int kv_rotated(int f) { return f == KV_I4; }

static inline uint16_t kv_f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static inline float kv_bf16_to_f32(uint16_t v) {
    union { uint32_t u; float f; } x = {.u = (uint32_t)v << 16};
    return x.f;
}
static inline uint16_t kv_f32_to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static inline float kv_f16_to_f32(uint16_t u) {
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}

/* fp8 with e exponent bits (4: e4m3fn, bias 7; 5: e5m2, bias 15), round to nearest even; |x| is
 * already clamped into range by the caller */
static inline uint8_t kv_f32_to_fp8(float x, int e4m3) {
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffff;
    float a;
    memcpy(&a, &u, 4);
    const float min_normal = ldexpf(1.f, 1 - bias);
    uint32_t code;
    if (a < min_normal) { /* subnormal: multiples of 2^(1 - bias - mbits) */
        code = (uint32_t)nearbyintf(ldexpf(a, bias - 1 + mbits));
    } else {
        const int drop = 23 - mbits;
        u += (1u << (drop - 1)) - 1 + ((u >> drop) & 1);
        code = (u >> drop) - ((uint32_t)(127 - bias) << mbits);
    }
    const uint32_t top = e4m3 ? 0x7e : 0x7b; /* 448, 57344 */
    return sign | (uint8_t)(code > top ? top : code);
}
static inline float kv_fp8_to_f32(uint8_t b, int e4m3) {
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    const int e = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
    const float v = e ? ldexpf(1.f + (float)m / (float)(1 << mbits), e - bias) : ldexpf((float)m, 1 - bias - mbits);
    return b & 0x80 ? -v : v;
}

/* normalized Walsh-Hadamard transform in place, blocks of the largest power of two dividing D */
static inline void kv_fwht(float *x, int64_t D) {
    const int64_t n = D & -D;
    const float norm = (float)(1.0 / sqrt((double)n));
    for (int64_t b = 0; b < D; b += n) {
        float *y = x + b;
        for (int64_t h = 1; h < n; h *= 2)
            for (int64_t i = 0; i < n; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const float p = y[j], q = y[j + h];
                    y[j] = p + q;
                    y[j + h] = p - q;
                }
        for (int64_t i = 0; i < n; i++) y[i] *= norm;
    }
}

/* fp16 scale of factor * m and its exact reciprocal (0 for a zero scale) */
static inline uint16_t kv_scale(float m, float factor, float *inv) {
    const uint16_t s = kv_f32_to_f16(m * factor);
    const float sf = kv_f16_to_f32(s);
    *inv = sf != 0.f ? 1.f / sf : 0.f;
    return s;
}

static inline float kv_amax(const float *x, int64_t n) {
    float a = 0.f;
    for (int64_t i = 0; i < n; i++) a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
    return a;
}

static inline float kv_clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

#define KV_MAX_ROTATED_D 1024

/* int4 scale candidates d = factor * m (m the group's value of largest magnitude): the plain grid (m to
 * -8) and three that clip m to make the step finer; a group keeps the one with the least squared error.
 * Exact binary fractions, so torch and C scale alike. */
#define KV_I4_CANDIDATES 4
static const float KV_I4_FACTORS[KV_I4_CANDIDATES] = {-0.125f, -0.1171875f, -0.109375f, -0.1015625f};

/* squared error of one group of 32 rounded with step d: terms exact in double, summed in index order
 * (no reassociation here, so the choice is torch's bit for bit) */
__attribute__((optimize("no-associative-math"))) static double kv_i4_err(const float *xg, float d, float inv) {
    double e = 0.0;
    for (int j = 0; j < 32; j++) {
        const float q = kv_clampf(nearbyintf(xg[j] * inv), -8.f, 7.f);
        const double t = (double)(xg[j] - q * d);
        e += t * t;
    }
    return e;
}

/* one vector x[D] fp32 into data (+ its scales) */
static inline void kv_store(int f, void *data, uint16_t *scale, const float *x, int64_t D) {
    float inv, r[f == KV_I4 ? KV_MAX_ROTATED_D : 1];
    switch (f) {
    case KV_F32: memcpy(data, x, sizeof(float) * (size_t)D); return;
    case KV_BF16: for (int64_t i = 0; i < D; i++) ((uint16_t *)data)[i] = kv_f32_to_bf16(x[i]); return;
    case KV_F16: for (int64_t i = 0; i < D; i++) ((uint16_t *)data)[i] = kv_f32_to_f16(x[i]); return;
    case KV_I8:
        scale[0] = kv_scale(kv_amax(x, D), 1.f / 127.f, &inv);
        for (int64_t i = 0; i < D; i++) ((int8_t *)data)[i] = (int8_t)kv_clampf(nearbyintf(x[i] * inv), -127.f, 127.f);
        return;
    case KV_I4:
        memcpy(r, x, sizeof(float) * (size_t)D);
        kv_fwht(r, D);
        for (int64_t g = 0; g < D / 32; g++) {
            const float *xg = r + 32 * g;
            float m = 0.f, best = 0.f;
            for (int j = 0; j < 32; j++)
                if (fabsf(xg[j]) > best) best = fabsf(xg[j]), m = xg[j];
            double least = 0.0;
            for (int c = 0; c < KV_I4_CANDIDATES; c++) {
                float ci;
                const uint16_t sc = kv_scale(m, KV_I4_FACTORS[c], &ci);
                const double e = kv_i4_err(xg, kv_f16_to_f32(sc), ci);
                if (c == 0 || e < least) least = e, scale[g] = sc, inv = ci;
            }
            uint8_t *d = (uint8_t *)data + 16 * g;
            for (int j = 0; j < 16; j++) {
                const int lo = (int)kv_clampf(nearbyintf(xg[j] * inv), -8.f, 7.f) + 8;
                const int hi = (int)kv_clampf(nearbyintf(xg[j + 16] * inv), -8.f, 7.f) + 8;
                d[j] = (uint8_t)(lo | hi << 4);
            }
        }
        return;
    case KV_E4M3: case KV_E5M2: {
        const int e4 = f == KV_E4M3;
        const float top = e4 ? 448.f : 57344.f;
        scale[0] = kv_scale(kv_amax(x, D), e4 ? 1.f / 448.f : 1.f / 256.f, &inv);
        for (int64_t i = 0; i < D; i++) ((uint8_t *)data)[i] = kv_f32_to_fp8(kv_clampf(x[i] * inv, -top, top), e4);
        return;
    }
    }
}

/* one stored vector back to fp32 (rotated formats stay rotated) */
static inline void kv_load(int f, const void *data, const uint16_t *scale, float *out, int64_t D) {
    switch (f) {
    case KV_F32: memcpy(out, data, sizeof(float) * (size_t)D); return;
    case KV_BF16: for (int64_t i = 0; i < D; i++) out[i] = kv_bf16_to_f32(((const uint16_t *)data)[i]); return;
    case KV_F16: for (int64_t i = 0; i < D; i++) out[i] = kv_f16_to_f32(((const uint16_t *)data)[i]); return;
    case KV_I8: {
        const float s = kv_f16_to_f32(scale[0]);
        for (int64_t i = 0; i < D; i++) out[i] = (float)((const int8_t *)data)[i] * s;
        return;
    }
    case KV_I4:
        for (int64_t g = 0; g < D / 32; g++) {
            const float d = kv_f16_to_f32(scale[g]);
            const uint8_t *b = (const uint8_t *)data + 16 * g;
            for (int j = 0; j < 16; j++) {
                out[32 * g + j] = (float)((b[j] & 15) - 8) * d;
                out[32 * g + j + 16] = (float)((b[j] >> 4) - 8) * d;
            }
        }
        return;
    default: {
        const float s = kv_f16_to_f32(scale[0]);
        for (int64_t i = 0; i < D; i++) out[i] = kv_fp8_to_f32(((const uint8_t *)data)[i], f == KV_E4M3) * s;
    }
    }
}
