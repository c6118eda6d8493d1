/* Decode attention with AVX-512 for head_dim a multiple of QK_W (<= 256); included by
 * paged_attention.c once per cache type with: FAST (function name), KV_T (element type), QK_W
 * (elements per q.k step), QV_T (prepared q vector), Q_PREP(dst, src) (16 or 32 q floats -> one
 * QV_T, stored), QK_STEP(acc, q, kptr), V_LOAD16(ptr) (16 V elements -> fp32). Same contract as
 * paged_attention_attend.h, plus qbuf: room for the H*D prepared query (4 bytes per element).
 * The cache is walked in chunks of <= 16 positions inside one block, each chunk's K (then V) rows
 * used by every head of the task while they sit in L1, blocks prefetched ahead into L2. Scores: q (rounded
 * to bf16 for a bf16 cache) against each key row (vdpbf16ps or FMA), the 16 partial sums folded by one transpose-reduce
 * into a vector of 16 scores. Values: per head, D/16 fp32 accumulators over the chunk's rows. */
#ifndef ATT_MAX_D
#define ATT_MAX_D 256

/* the first row of position pos; rows are Hkv * D elements of elem bytes */
static inline const char *chunk_ptr(const void *cache, const int64_t *table, int64_t pos, int64_t bs,
                                    int64_t row, int64_t elem) {
    return (const char *)cache + (table[pos / bs] * bs + pos % bs) * row * elem;
}

static inline void prefetch_rows(const char *p, int64_t bytes) {
    for (const char *c = p; c < p + bytes; c += 64) _mm_prefetch(c, _MM_HINT_T1);
}

/* Blocks are scattered, which the hardware prefetcher cannot follow. The two passes read one
 * stream of 2 * nblk blocks (K blocks, then the same blocks of V); at each block the pass
 * prefetches the one PF_BLOCKS ahead in that stream (into L2), so V's first blocks arrive while
 * K's last ones are scored. */
#define PF_BLOCKS 4
static inline void prefetch_block(const void *kc, const void *vc, const int64_t *table, int64_t blk0, int64_t nblk,
                                  int64_t idx, int64_t bs, int64_t row, int64_t elem) {
    if (idx >= 2 * nblk) return;
    const void *cache = idx < nblk ? kc : vc;
    const int64_t blk = blk0 + (idx < nblk ? idx : idx - nblk);
    prefetch_rows((const char *)cache + table[blk] * bs * row * elem, bs * row * elem);
}

/* positions [pos, pos + cnt) share one block: cnt = min(16, block end, len) - pos */
static inline int64_t chunk_len(int64_t pos, int64_t len, int64_t bs) {
    const int64_t end = (pos / bs + 1) * bs < len ? (pos / bs + 1) * bs : len;
    return end - pos < 16 ? end - pos : 16;
}
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* ND = D / QK_W, a compile-time constant in each instantiation so the accumulators stay in registers */
static inline __attribute__((always_inline)) void
CAT(FAST, _nd)(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *table, int64_t len, float *out,
               int64_t H, int64_t Hkv, int64_t h0, int64_t h1, int64_t bs, int64_t window, float scale,
               float *scores, void *qbuf, const int64_t nd) {
    const int64_t D = QK_W * nd, G = H / Hkv, first = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - first, row = Hkv * D, heads = (h1 - h0) * G, E = sizeof(KV_T);
    const float *qt = q + h0 * G * D;
    QV_T *qp = (QV_T *)qbuf;
    for (int64_t i = 0; i < heads * nd; i++) Q_PREP(qp + i, qt + QK_W * i);
    const __m512 vscale = _mm512_set1_ps(scale);
    const int64_t blk0 = first / bs, nblk = (len - 1) / bs + 1 - blk0;
    for (int64_t i = 0; i < PF_BLOCKS; i++) prefetch_block(kc, vc, table, blk0, nblk, i, bs, row, E);
    for (int64_t pos = first, cnt; pos < len; pos += cnt) {
        cnt = chunk_len(pos, len, bs);
        const KV_T *k = (const KV_T *)chunk_ptr(kc, table, pos, bs, row, E);
        if (pos == first || pos % bs == 0) prefetch_block(kc, vc, table, blk0, nblk, pos / bs - blk0 + PF_BLOCKS, bs, row, E);
        for (int64_t hk = h0; hk < h1; hk++) {
            const KV_T *kh = k + hk * D;
            for (int64_t g = 0; g < G; g++) {
                const int64_t r = (hk - h0) * G + g;
                const QV_T *qr = qp + r * nd;
                __m512 acc[16];
                for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
                if (cnt == 16) {
#pragma GCC unroll 16
                    for (int64_t j = 0; j < 16; j++)
                        for (int64_t i = 0; i < nd; i++) acc[j] = QK_STEP(acc[j], qr[i], kh + j * row + QK_W * i);
                } else {
#pragma GCC unroll 16
                    for (int64_t j = 0; j < 16; j++)
                        if (j < cnt)
                            for (int64_t i = 0; i < nd; i++) acc[j] = QK_STEP(acc[j], qr[i], kh + j * row + QK_W * i);
                }
                _mm512_mask_storeu_ps(scores + r * n + pos - first, (__mmask16)((1u << cnt) - 1),
                                      _mm512_mul_ps(reduce16(acc), vscale));
            }
        }
    }
    for (int64_t r = 0; r < heads; r++) {
        float *sr = scores + r * n;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 t = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), t, sr + j));
        }
        const float m = _mm512_reduce_max_ps(vmax);
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
        const KV_T *v = (const KV_T *)chunk_ptr(vc, table, pos, bs, row, E);
        if (pos == first || pos % bs == 0)
            prefetch_block(kc, vc, table, blk0, nblk, nblk + pos / bs - blk0 + PF_BLOCKS, bs, row, E);
        for (int64_t hk = h0; hk < h1; hk++) {
            const KV_T *vh = v + hk * D;
            /* query heads two at a time: twice the independent FMA chains, each V vector loaded once for
             * both; every head still adds its positions in order */
            for (int64_t g = 0; g < G; g += 2) {
                const int64_t r = (hk - h0) * G + g;
                const float *s0 = scores + r * n + pos - first, *s1 = s0 + n;
                float *o0p = ot + r * D, *o1p = o0p + D;
                __m512 o0[ATT_MAX_D / 16], o1[ATT_MAX_D / 16];
                for (int64_t i = 0; i < D / 16; i++) o0[i] = _mm512_loadu_ps(o0p + 16 * i);
                if (g + 1 < G) {
                    for (int64_t i = 0; i < D / 16; i++) o1[i] = _mm512_loadu_ps(o1p + 16 * i);
                    for (int64_t j = 0; j < cnt; j++) {
                        const __m512 p0 = _mm512_set1_ps(s0[j]), p1 = _mm512_set1_ps(s1[j]);
                        for (int64_t i = 0; i < D / 16; i++) {
                            const __m512 vv = V_LOAD16(vh + j * row + 16 * i);
                            o0[i] = _mm512_fmadd_ps(p0, vv, o0[i]);
                            o1[i] = _mm512_fmadd_ps(p1, vv, o1[i]);
                        }
                    }
                    for (int64_t i = 0; i < D / 16; i++) _mm512_storeu_ps(o1p + 16 * i, o1[i]);
                } else {
                    for (int64_t j = 0; j < cnt; j++) {
                        const __m512 p0 = _mm512_set1_ps(s0[j]);
                        for (int64_t i = 0; i < D / 16; i++)
                            o0[i] = _mm512_fmadd_ps(p0, V_LOAD16(vh + j * row + 16 * i), o0[i]);
                    }
                }
                for (int64_t i = 0; i < D / 16; i++) _mm512_storeu_ps(o0p + 16 * i, o0[i]);
            }
        }
    }
}

static void FAST(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *table, int64_t len, float *out,
                 int64_t H, int64_t Hkv, int64_t h0, int64_t h1, int64_t D, int64_t bs, int64_t window, float scale,
                 float *scores, void *qbuf) {
#define ND_CASE(nd) CAT(FAST, _nd)(q, kc, vc, table, len, out, H, Hkv, h0, h1, bs, window, scale, scores, qbuf, nd)
    switch (D / QK_W) {
        case 1: ND_CASE(1); break;
        case 2: ND_CASE(2); break;
        case 4: ND_CASE(4); break;
        case 8: ND_CASE(8); break;
        default: ND_CASE(D / QK_W);
    }
#undef ND_CASE
}
