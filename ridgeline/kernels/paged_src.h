/* What the attention kernels read (paged_attention.c, paged_prefill.c): the paged K and V caches of
 * one layer in their KV formats (kv_quant.h), and one task's range of positions and KV heads. */
#pragma once
#include <stdint.h>

typedef struct {
    const char *data[2]; /* K, V */
    const uint16_t *scale[2];
    int fmt[2];
    int64_t vb[2], ns[2]; /* data bytes and scales per (position, head) vector */
    int64_t Hkv, D, G, bs;
    float scale_qk;
} att_src;

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

/* a row of key length len sees positions [first_key, len): the last `window` ones when window > 0 */
static inline int64_t first_key(int64_t len, int64_t window) { return window > 0 && len > window ? len - window : 0; }
