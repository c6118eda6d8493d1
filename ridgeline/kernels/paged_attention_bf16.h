/* Decode attention for a bf16 KV cache on AVX512-BF16, for head_dim a multiple of 32 (<= 256);
 * included by paged_attention.c. Same contract as paged_attention_attend.h, plus qbuf: room for the
 * H*D bf16 query.
 * The cache is walked in chunks of <= 16 positions inside one block, each chunk's K (then V) rows
 * used by every head of the task while they sit in L1, and the next chunk prefetched into L2 (a
 * sequence's blocks are scattered, which the hardware prefetcher cannot follow). Scores: q (rounded
 * to bf16) against each key row with vdpbf16ps, the 16 partial sums folded by one transpose-reduce
 * into a vector of 16 scores. Values: per head, D/16 fp32 accumulators over the chunk's rows. */
#define ATT_MAX_D 256

static inline const uint16_t *chunk_ptr(const uint16_t *cache, const int64_t *table, int64_t pos, int64_t bs,
                                        int64_t row) {
    return cache + (table[pos / bs] * bs + pos % bs) * row;
}

static inline void prefetch_rows(const uint16_t *p, int64_t rows, int64_t row) {
    const char *c = (const char *)p, *end = (const char *)(p + rows * row);
    for (; c < end; c += 64) _mm_prefetch(c, _MM_HINT_T1);
}

/* positions [pos, pos + cnt) share one block: cnt = min(16, block end, len) - pos */
static inline int64_t chunk_len(int64_t pos, int64_t len, int64_t bs) {
    const int64_t end = (pos / bs + 1) * bs < len ? (pos / bs + 1) * bs : len;
    return end - pos < 16 ? end - pos : 16;
}

/* ND = D / 32, a compile-time constant in each instantiation so the accumulators stay in registers */
static inline __attribute__((always_inline)) void
attend_bf16_nd(const float *q, const uint16_t *kc, const uint16_t *vc, const int64_t *table, int64_t len,
               float *out, int64_t H, int64_t Hkv, int64_t h0, int64_t h1, int64_t bs, int64_t window,
               float scale, float *scores, uint16_t *qbuf, const int64_t nd) {
    const int64_t D = 32 * nd, G = H / Hkv, first = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - first, row = Hkv * D, heads = (h1 - h0) * G;
    const float *qt = q + h0 * G * D;
    for (int64_t i = 0; i < heads * nd; i++)
        _mm512_storeu_si512(qbuf + 32 * i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(qt + 32 * i + 16),
                                                                        _mm512_loadu_ps(qt + 32 * i)));
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t pos = first, cnt; pos < len; pos += cnt) {
        cnt = chunk_len(pos, len, bs);
        const uint16_t *k = chunk_ptr(kc, table, pos, bs, row);
        if (pos + cnt < len) prefetch_rows(chunk_ptr(kc, table, pos + cnt, bs, row), chunk_len(pos + cnt, len, bs), row);
        for (int64_t hk = h0; hk < h1; hk++) {
            const uint16_t *kh = k + hk * D;
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = (hk - h0) * G + g;
                __m512bh qb[ATT_MAX_D / 32];
                for (int64_t i = 0; i < nd; i++) qb[i] = (__m512bh)_mm512_loadu_si512(qbuf + (r * nd + i) * 32);
                __m512 acc[16];
                for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
#pragma GCC unroll 16
                for (int64_t j = 0; j < 16; j++)
                    if (j < cnt)
                        for (int64_t i = 0; i < nd; i++)
                            acc[j] = _mm512_dpbf16_ps(acc[j], qb[i], (__m512bh)_mm512_loadu_si512(kh + j * row + 32 * i));
                _mm512_mask_storeu_ps(scores + r * n + pos - first, (__mmask16)((1u << cnt) - 1),
                                      _mm512_mul_ps(reduce16(acc), vscale));
            }
        }
    }
    for (int64_t r = 0; r < heads; r++) {
        float *sr = scores + r * n, m = sr[0];
        for (int64_t j = 1; j < n; j++) m = sr[j] > m ? sr[j] : m;
        __m512 vsum = _mm512_setzero_ps();
        const __m512 vm = _mm512_set1_ps(m);
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 t = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            const __m512 e = vexp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, sr + j), vm));
            vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(t, e));
            _mm512_mask_storeu_ps(sr + j, t, e);
        }
        const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(vsum));
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 t = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            _mm512_mask_storeu_ps(sr + j, t, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, sr + j), inv));
        }
    }
    float *ot = out + h0 * G * D;
    for (int64_t i = 0; i < heads * D; i++) ot[i] = 0.f;
    for (int64_t pos = first, cnt; pos < len; pos += cnt) {
        cnt = chunk_len(pos, len, bs);
        const uint16_t *v = chunk_ptr(vc, table, pos, bs, row);
        if (pos + cnt < len) prefetch_rows(chunk_ptr(vc, table, pos + cnt, bs, row), chunk_len(pos + cnt, len, bs), row);
        for (int64_t hk = h0; hk < h1; hk++) {
            const uint16_t *vh = v + hk * D;
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = (hk - h0) * G + g;
                const float *sr = scores + r * n + pos - first;
                float *og = ot + r * D;
                __m512 o[ATT_MAX_D / 16];
                for (int64_t i = 0; i < 2 * nd; i++) o[i] = _mm512_loadu_ps(og + 16 * i);
                for (int64_t j = 0; j < cnt; j++) {
                    const __m512 p = _mm512_set1_ps(sr[j]);
                    for (int64_t i = 0; i < 2 * nd; i++) {
                        __m512 vf = _mm512_castsi512_ps(_mm512_slli_epi32(
                            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(vh + j * row + 16 * i))), 16));
                        o[i] = _mm512_fmadd_ps(p, vf, o[i]);
                    }
                }
                for (int64_t i = 0; i < 2 * nd; i++) _mm512_storeu_ps(og + 16 * i, o[i]);
            }
        }
    }
}

static void attend_bf16_dot(const float *q, const uint16_t *kc, const uint16_t *vc, const int64_t *table,
                            int64_t len, float *out, int64_t H, int64_t Hkv, int64_t h0, int64_t h1, int64_t D,
                            int64_t bs, int64_t window, float scale, float *scores, uint16_t *qbuf) {
    switch (D) {
        case 32: attend_bf16_nd(q, kc, vc, table, len, out, H, Hkv, h0, h1, bs, window, scale, scores, qbuf, 1); break;
        case 64: attend_bf16_nd(q, kc, vc, table, len, out, H, Hkv, h0, h1, bs, window, scale, scores, qbuf, 2); break;
        case 128: attend_bf16_nd(q, kc, vc, table, len, out, H, Hkv, h0, h1, bs, window, scale, scores, qbuf, 4); break;
        default: attend_bf16_nd(q, kc, vc, table, len, out, H, Hkv, h0, h1, bs, window, scale, scores, qbuf, D / 32);
    }
}
