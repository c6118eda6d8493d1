/* What the attention kernels read (paged_attention.c, paged_prefill.c): the paged K and V caches of
 * one layer in their KV formats (kv_quant.h), and one task's range of positions and KV heads. */
#pragma once
#include <math.h>
#include <stdint.h>

typedef struct {
    const char *data[2]; /* K, V */
    const uint16_t *scale[2];
    int fmt[2];
    int64_t vb[2], ns[2]; /* data bytes and scales per (position, head) vector */
    int64_t Hkv, D, G, bs;
    float scale_qk;
    /* NULL, or [Hkv, D] in K's stored basis: the key at position 0 is stored minus a center of its own
     * (a centered K format, ridgeline/layers/kv_cache.py), and this is added back to it after dequantizing
     * so that its score moves by the same q.center as every other key's (softmax ignores that) */
    const float *k0off;
    float softcap; /* > 0: scores -> softcap * tanh(scores / softcap) before the softmax (Gemma 2); 0: none */
    /* NULL, or [H] learned logits, one per query head (GPT-OSS's attention sinks): each joins its head's
     * softmax as a key without a value, so it only adds exp(sink - m) to the denominator l */
    const float *sinks;
} att_src;

/* a finished row's softmax denominator: l, plus its head's sink where there are sinks (m: the row's max) */
static inline float denominator(float l, float m, const float *sinks, int64_t head) {
    return sinks ? l + expf(sinks[head] - m) : l;
}

/* the soft-cap of one score, and of n scores in place (nothing without one) */
static inline float soft_capped(float x, float cap) { return cap > 0.f ? cap * tanhf(x / cap) : x; }
static inline void soft_cap_all(float *x, int64_t n, float cap) {
    if (cap > 0.f)
        for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

/* one task's range: heads [h0, h1) of one row, positions [lo, hi); end_blk: the row's last block */
typedef struct {
    const int64_t *table;
    int64_t lo, hi, h0, h1, end_blk;
} att_range;

static inline const char *vec_ptr(const att_src *s, int w, int64_t slot, int64_t h) {
    return s->data[w] + (slot * s->Hkv + h) * s->vb[w];
}
static inline const uint16_t *scale_ptr(const att_src *s, int w, int64_t slot, int64_t h) {
    return s->scale[w] ? s->scale[w] + (slot * s->Hkv + h) * s->ns[w] : NULL;
}

/* key 0's K (dequantized, k0off added) and V for KV head hk into k0[D], v0[D] */
static inline void load_key0(const att_src *s, const int64_t *table, int64_t hk, float *k0, float *v0) {
    const int64_t slot = table[0] * s->bs;
    kv_load(s->fmt[0], vec_ptr(s, 0, slot, hk), scale_ptr(s, 0, slot, hk), k0, s->D);
    kv_load(s->fmt[1], vec_ptr(s, 1, slot, hk), scale_ptr(s, 1, slot, hk), v0, s->D);
    for (int64_t d = 0; d < s->D; d++) k0[d] += s->k0off[hk * s->D + d];
}

/* running softmax state (m, l, u[D]) of one row += the key with score sc and value v (empty: start from it) */
static inline void add_key(float *m, float *l, float *u, float sc, const float *v, int64_t D, int empty) {
    const float mx = empty || sc > *m ? sc : *m, a = empty ? 0.f : expf(*m - mx), c = expf(sc - mx);
    *l = empty ? c : *l * a + c;
    *m = mx;
    for (int64_t d = 0; d < D; d++) u[d] = (empty ? 0.f : u[d] * a) + c * v[d];
}

/* a row of key length len sees positions [first_key, len): the last `window` ones when window > 0 */
static inline int64_t first_key(int64_t len, int64_t window) { return window > 0 && len > window ? len - window : 0; }
