/* AVX-512 helpers of the attention kernels (paged_attention.c, after att_src / att_range): the walk in
 * chunks of <= 16 positions inside one block, prefetch ahead of the walk (blocks are scattered, which
 * the hardware prefetcher cannot follow), and dequantization of one head's chunk
 * into an fp32 tile [16, D] (D a multiple of 16; int4: of 32), read from L1 by the score and value loops. */
#pragma once
#include <immintrin.h>

#define ATT_MAX_D 256

/* positions [pos, pos + cnt) share one block: cnt = min(16, block end, hi) - pos */
static inline int64_t chunk_len(int64_t pos, int64_t hi, int64_t bs) {
    const int64_t end = (pos / bs + 1) * bs < hi ? (pos / bs + 1) * bs : hi;
    return end - pos < 16 ? end - pos : 16;
}

#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
static inline void prefetch_bytes(const char *p, int64_t bytes) {
    for (const char *c = p; c < p + bytes; c += 64) _mm_prefetch(c, PF_HINT);
}

/* The passes read one stream: the split's K blocks, its V blocks, then the next split's K blocks. A
 * cursor runs PF_BYTES ahead of the reads in that stream and advances as they consume it, a few lines
 * at a time between the arithmetic (a block's worth at once would queue behind the line-fill buffers
 * and stall the loads), so V's first blocks arrive while K's last ones are scored, and the next
 * split's K while this V is summed. */
#ifndef PF_BYTES
#define PF_BYTES 8192
#endif
typedef struct {
    int64_t idx, off; /* block idx of the stream, byte offset in the task's part of that block */
    int64_t b0, nb, next0; /* the split's first block and block count, the next split's first block */
} pf_cursor;

static inline pf_cursor pf_start(const att_src *s, const att_range *r) {
    const int64_t b0 = r->lo / s->bs;
    return (pf_cursor){0, 0, b0, (r->hi - 1) / s->bs + 1 - b0, r->hi / s->bs};
}

/* prefetch the next `bytes` of the stream after the cursor and move it past them (no division on
 * the way when the task reads whole positions, as decode tasks do) */
static inline void pf_advance(const att_src *s, const att_range *r, pf_cursor *c, int64_t bytes) {
    const int64_t heads = r->h1 - r->h0;
    while (bytes > 0) {
        const int w = c->idx >= c->nb && c->idx < 2 * c->nb;
        const int64_t blk = c->idx < c->nb ? c->b0 + c->idx : w ? c->b0 + c->idx - c->nb : c->next0 + c->idx - 2 * c->nb;
        if (blk > r->end_blk) return;
        const int64_t vb = s->vb[w], row = heads * vb, size = s->bs * row, slot = r->table[blk] * s->bs;
        const char *base = s->data[w] + (slot * s->Hkv + r->h0) * vb;
        if (c->off == 0 && s->scale[w])
            prefetch_bytes((const char *)(s->scale[w] + slot * s->Hkv * s->ns[w]), s->bs * s->Hkv * s->ns[w] * 2);
        const int64_t end = c->off + bytes < size ? c->off + bytes : size;
        if (heads == s->Hkv)
            for (int64_t o = (c->off + 63) & ~(int64_t)63; o < end; o += 64) _mm_prefetch(base + o, PF_HINT);
        else /* lines starting in [off, end) of the task's heads, position by position */
            for (int64_t o = (c->off + 63) & ~(int64_t)63; o < end; o += 64)
                _mm_prefetch(base + o / row * s->Hkv * vb + o % row, PF_HINT);
        bytes -= end - c->off;
        c->off = end;
        if (end == size) c->idx++, c->off = 0;
    }
}

static inline float f16_scale(const uint16_t *p) { return _cvtsh_ss(*p); }

/* fp8 bytes -> 16 fp16 values, exact; e4m3 comes out 2^-8 too small (folded into its scale) */
static inline __m512 fp8_16(const void *p, int e4m3) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i h = e4m3 ? _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                             _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7))
                           : _mm256_slli_epi16(w, 8);
    return _mm512_cvtph_ps(h);
}

/* rows [0, cnt) of the tile = head hk's vectors at slots [slot, slot + cnt), w: 0 K, 1 V */
static inline const float *deq_chunk(const att_src *s, int w, int64_t slot, int64_t cnt, int64_t hk, float *tile) {
    const int64_t D = s->D, stride = s->Hkv * s->vb[w], sstride = s->Hkv * s->ns[w];
    const char *p = s->data[w] + (slot * s->Hkv + hk) * s->vb[w];
    const uint16_t *sc = s->scale[w] ? s->scale[w] + (slot * s->Hkv + hk) * s->ns[w] : NULL;
    const int f = s->fmt[w];
    for (int64_t j = 0; j < cnt; j++, p += stride, sc += sstride) {
        float *t = tile + j * D;
        switch (f) {
        case KV_F32:
            memcpy(t, p, sizeof(float) * (size_t)D);
            break;
        case KV_BF16:
            for (int64_t i = 0; i < D; i += 16)
                _mm512_storeu_ps(t + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p + 2 * i))), 16)));
            break;
        case KV_F16:
            for (int64_t i = 0; i < D; i += 16)
                _mm512_storeu_ps(t + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 2 * i))));
            break;
        case KV_I8: {
            const __m512 v = _mm512_set1_ps(f16_scale(sc));
            for (int64_t i = 0; i < D; i += 16)
                _mm512_storeu_ps(t + i, _mm512_mul_ps(v, _mm512_cvtepi32_ps(
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + i))))));
            break;
        }
        case KV_I4:
            for (int64_t g = 0; g < D / 32; g++) {
                const __m512 d = _mm512_set1_ps(f16_scale(sc + g));
                const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * g)));
                const __m512i eight = _mm512_set1_epi32(8);
                const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(b, _mm512_set1_epi32(15)), eight);
                const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight);
                _mm512_storeu_ps(t + 32 * g, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
                _mm512_storeu_ps(t + 32 * g + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
            }
            break;
        default: { /* fp8 */
            const int e4 = f == KV_E4M3;
            const __m512 v = _mm512_set1_ps(f16_scale(sc) * (e4 ? 256.f : 1.f));
            for (int64_t i = 0; i < D; i += 16) _mm512_storeu_ps(t + i, _mm512_mul_ps(v, fp8_16(p + i, e4)));
        }
        }
    }
    return tile;
}
