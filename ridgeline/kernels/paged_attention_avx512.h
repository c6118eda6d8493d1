/* One split's partial attention with AVX-512 (head_dim a multiple of QK_W, <= ATT_MAX_D); included by
 * paged_attention.c once per cache reading with: FAST (function name), KV_T (element type read by the
 * loops), QK_W (elements per q.k step), QV_T (prepared q vector), Q_PREP(dst, src) (QK_W q floats ->
 * one QV_T, stored), QK_STEP(acc, q, kptr), V_LOAD16(ptr) (16 V elements -> fp32), and TILE defined
 * when each head's chunk is first dequantized into the fp32 tile (any format; else K and V are read
 * in place as KV_T). Same contract as attend_any, plus qbuf: room for the prepared query.
 * The walk goes in chunks of <= 16 positions inside one block; a chunk's K (then V) rows serve every
 * query head of their KV head while they sit in L1. Scores: q (rounded to bf16 for a bf16 cache)
 * against each key row (vdpbf16ps or FMA), the 16 partial sums folded by one transpose-reduce into a
 * vector of 16 scores. Values: per head, D/16 fp32 accumulators over the chunk's rows. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#ifdef TILE
#define CHUNK(w, slot, hk) ((const KV_T *)deq_chunk(s, w, slot, cnt, hk, tile))
#define ROW(w) D
#else
#define CHUNK(w, slot, hk) ((const KV_T *)vec_ptr(s, w, slot, hk))
#define ROW(w) (s->Hkv * D)
#endif

/* ND = D / QK_W, a compile-time constant in each instantiation so the accumulators stay in registers */
static inline __attribute__((always_inline)) void
CAT(FAST, _nd)(const att_src *s, const float *q, const att_range *r, float *scores, float *tile, void *qbuf,
               float *m, float *l, float *u, const int64_t nd) {
    const int64_t D = QK_W * nd, G = s->G, bs = s->bs, lo = r->lo, hi = r->hi, n = hi - lo;
    const int64_t heads = (r->h1 - r->h0) * G;
    (void)tile;
    QV_T *qp = (QV_T *)qbuf;
    for (int64_t i = 0; i < heads * nd; i++) Q_PREP(qp + i, q + QK_W * i);
    const __m512 vscale = _mm512_set1_ps(s->scale_qk);
    const int64_t nb = (hi - 1) / bs + 1 - lo / bs;
    for (int64_t i = 0; i < PF_BLOCKS; i++) prefetch_stream(s, r, i);
    for (int64_t pos = lo, cnt; pos < hi; pos += cnt) {
        cnt = chunk_len(pos, hi, bs);
        const int64_t slot = r->table[pos / bs] * bs + pos % bs;
        if (pos == lo || pos % bs == 0) prefetch_stream(s, r, pos / bs - lo / bs + PF_BLOCKS);
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            const KV_T *kh = CHUNK(0, slot, hk);
            for (int64_t g = 0; g < G; g++) {
                const int64_t i = (hk - r->h0) * G + g;
                const QV_T *qr = qp + i * nd;
                __m512 acc[16];
                for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
                if (cnt == 16) {
#pragma GCC unroll 16
                    for (int64_t j = 0; j < 16; j++)
                        for (int64_t e = 0; e < nd; e++) acc[j] = QK_STEP(acc[j], qr[e], kh + j * ROW(0) + QK_W * e);
                } else {
#pragma GCC unroll 16
                    for (int64_t j = 0; j < 16; j++)
                        if (j < cnt)
                            for (int64_t e = 0; e < nd; e++)
                                acc[j] = QK_STEP(acc[j], qr[e], kh + j * ROW(0) + QK_W * e);
                }
                _mm512_mask_storeu_ps(scores + i * n + pos - lo, (__mmask16)((1u << cnt) - 1),
                                      _mm512_mul_ps(reduce16(acc), vscale));
            }
        }
    }
    for (int64_t i = 0; i < heads; i++) { /* p = exp(s - m), unnormalized: the merge divides once */
        float *sr = scores + i * n;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 t = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), t, sr + j));
        }
        const float mx = _mm512_reduce_max_ps(vmax);
        __m512 vsum = _mm512_setzero_ps();
        const __m512 vm = _mm512_set1_ps(mx);
        for (int64_t j = 0; j < n; j += 16) {
            const __mmask16 t = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            const __m512 e = vexp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, sr + j), vm));
            vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(t, e));
            _mm512_mask_storeu_ps(sr + j, t, e);
        }
        m[i] = mx;
        l[i] = _mm512_reduce_add_ps(vsum);
    }
    for (int64_t i = 0; i < heads * D; i++) u[i] = 0.f;
    for (int64_t pos = lo, cnt; pos < hi; pos += cnt) {
        cnt = chunk_len(pos, hi, bs);
        const int64_t slot = r->table[pos / bs] * bs + pos % bs;
        if (pos == lo || pos % bs == 0) prefetch_stream(s, r, nb + pos / bs - lo / bs + PF_BLOCKS);
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            const KV_T *vh = CHUNK(1, slot, hk);
            /* query heads two at a time: twice the independent FMA chains, each V vector loaded once for
             * both; every head still adds its positions in order */
            for (int64_t g = 0; g < G; g += 2) {
                const int64_t i = (hk - r->h0) * G + g;
                const float *s0 = scores + i * n + pos - lo, *s1 = s0 + n;
                float *o0p = u + i * D, *o1p = o0p + D;
                __m512 o0[ATT_MAX_D / 16], o1[ATT_MAX_D / 16];
                for (int64_t e = 0; e < D / 16; e++) o0[e] = _mm512_loadu_ps(o0p + 16 * e);
                if (g + 1 < G) {
                    for (int64_t e = 0; e < D / 16; e++) o1[e] = _mm512_loadu_ps(o1p + 16 * e);
                    for (int64_t j = 0; j < cnt; j++) {
                        const __m512 p0 = _mm512_set1_ps(s0[j]), p1 = _mm512_set1_ps(s1[j]);
                        for (int64_t e = 0; e < D / 16; e++) {
                            const __m512 vv = V_LOAD16(vh + j * ROW(1) + 16 * e);
                            o0[e] = _mm512_fmadd_ps(p0, vv, o0[e]);
                            o1[e] = _mm512_fmadd_ps(p1, vv, o1[e]);
                        }
                    }
                    for (int64_t e = 0; e < D / 16; e++) _mm512_storeu_ps(o1p + 16 * e, o1[e]);
                } else {
                    for (int64_t j = 0; j < cnt; j++) {
                        const __m512 p0 = _mm512_set1_ps(s0[j]);
                        for (int64_t e = 0; e < D / 16; e++)
                            o0[e] = _mm512_fmadd_ps(p0, V_LOAD16(vh + j * ROW(1) + 16 * e), o0[e]);
                    }
                }
                for (int64_t e = 0; e < D / 16; e++) _mm512_storeu_ps(o0p + 16 * e, o0[e]);
            }
        }
    }
}

static void FAST(const att_src *s, const float *q, const att_range *r, float *scores, float *tile, void *qbuf,
                 float *m, float *l, float *u) {
#define ND_CASE(nd) CAT(FAST, _nd)(s, q, r, scores, tile, qbuf, m, l, u, nd)
    switch (s->D / QK_W) {
        case 1: ND_CASE(1); break;
        case 2: ND_CASE(2); break;
        case 4: ND_CASE(4); break;
        case 8: ND_CASE(8); break;
        default: ND_CASE(s->D / QK_W);
    }
#undef ND_CASE
}

#undef CHUNK
#undef ROW
