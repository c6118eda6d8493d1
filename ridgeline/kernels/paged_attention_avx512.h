/* One split's partial attention with AVX-512 (head_dim a multiple of QK_W, <= ATT_MAX_D); included by
 * paged_attention.c once per cache reading with: FAST (function name), KV_T (element type read by the
 * loops), QK_W (elements per q.k step), QV_T (prepared q vector), Q_PREP(dst, src) (QK_W q floats ->
 * one QV_T, stored), QK_STEP(acc, q, kptr), V_LOAD(ptr, e) (below), and TILE defined
 * when each head's chunk is first dequantized into the fp32 tile (any format; else K and V are read
 * in place as KV_T). Same contract as attend_any, plus qbuf: room for the prepared query.
 * The walk goes in chunks of <= 16 positions inside one block; a chunk's K (then V) rows serve every
 * query head of their KV head while they sit in L1. Scores: q (rounded to bf16 for a bf16 cache)
 * against each key row (vdpbf16ps or FMA), the 16 partial sums folded by one transpose-reduce into a
 * vector of 16 scores. Values: D/16 fp32 accumulators per query head, up to V_HEADS(nd) heads at a time
 * sharing each V vector; V_LOAD(ptr, e) -> the e-th 16 floats of a V row in the accumulators' order, and
 * V_ORDER(u, D), when defined, puts a head's finished row back into natural order. V_T (default KV_T):
 * the V element type read in place; V_SCALED: V rows are read in place (even with TILE) and each
 * (position, head) fp16 scale is folded into that position's weight instead. QK_INT16: K codes are read
 * in place against q rounded to int16 (q16_prep: a power-of-two scale per query head), summed exactly in
 * int32 accumulators (ACC_T), and each score carries its key's fp16 scale, q's scale and scale_qk. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#ifdef QK_INT16
#define ACC_T __m512i
#define ACC_ZERO _mm512_setzero_si512()
#define ACC_SUMS(acc) _mm512_cvtepi32_ps(reduce16i(acc))
#else
#define ACC_T __m512
#define ACC_ZERO _mm512_setzero_ps()
#define ACC_SUMS(acc) reduce16(acc)
#endif

#ifndef V_T
#define V_T KV_T
#define V_T_DEFAULT
#endif
#ifdef TILE
#define CHUNK_K(slot, hk) ((const KV_T *)deq_chunk(s, 0, slot, cnt, hk, tile))
#define ROW_K D
#else
#define CHUNK_K(slot, hk) ((const KV_T *)vec_ptr(s, 0, slot, hk))
#define ROW_K (s->Hkv * D)
#endif
#if defined(TILE) && !defined(V_SCALED)
#define CHUNK_V(slot, hk) ((const V_T *)deq_chunk(s, 1, slot, cnt, hk, tile))
#define ROW_V D
#else
#define CHUNK_V(slot, hk) ((const V_T *)vec_ptr(s, 1, slot, hk))
#define ROW_V (s->Hkv * s->vb[1] / (int64_t)sizeof(V_T))
#endif

/* K_WIDEN(dst, kptr) (with K_WIDE_T, K_WIDE_STEP(acc, q, wptr)): a chunk's K rows are widened once
 * into an aligned L1 buffer [16][D] of K_WIDE_T and every query head of the KV head dots against it,
 * instead of each head widening the same rows again (the same exact arithmetic). */
#ifdef K_WIDEN
#define K_SRC_T K_WIDE_T
#define K_ROW D
#define K_DOT K_WIDE_STEP
#else
#define K_SRC_T KV_T
#define K_ROW ROW_K
#define K_DOT QK_STEP
#endif

/* query heads per V pass call: at most 16 accumulators */
#define V_HEADS(nd) (QK_W * (nd) >= 256 ? 1 : QK_W * (nd) >= 128 ? 2 : 4)

/* u rows of nh query heads (stride D = 16 * ne) += the chunk's cnt V rows (row: elements apart) weighted by
 * their scores (sp, stride n; with V_SCALED already multiplied by each row's V scale): each V vector is loaded once for all nh heads, and each head adds its
 * positions in order whichever heads share the call, so grouping changes no result. Accumulators hold a
 * row in V_LOAD's order. */
static inline __attribute__((always_inline)) void CAT(FAST, _v)(const V_T *vh, int64_t row, const float *sp,
                                                                int64_t n, float *up,
                                                                int64_t cnt, const int nh, const int ne) {
    const int64_t D = 16 * ne;
    __m512 o[4][ATT_MAX_D / 16];
    for (int h = 0; h < nh; h++)
        for (int e = 0; e < ne; e++) o[h][e] = _mm512_loadu_ps(up + h * D + 16 * e);
    for (int64_t j = 0; j < cnt; j++) {
        __m512 p[4];
        for (int h = 0; h < nh; h++) p[h] = _mm512_set1_ps(sp[h * n + j]);
        for (int e = 0; e < ne; e++) {
            const __m512 vv = V_LOAD(vh + j * row, e);
            for (int h = 0; h < nh; h++) o[h][e] = _mm512_fmadd_ps(p[h], vv, o[h][e]);
        }
    }
    for (int h = 0; h < nh; h++)
        for (int e = 0; e < ne; e++) _mm512_storeu_ps(up + h * D + 16 * e, o[h][e]);
}

/* ND = D / QK_W, a compile-time constant in each instantiation so the accumulators stay in registers */
static inline __attribute__((always_inline)) void
CAT(FAST, _nd)(const att_src *s, const float *q, const att_range *r, float *scores, float *tile, void *qbuf,
               float *m, float *l, float *u, const int64_t nd) {
    const int64_t D = QK_W * nd, G = s->G, bs = s->bs, lo = r->lo, hi = r->hi, n = hi - lo;
    const int64_t heads = (r->h1 - r->h0) * G;
    (void)tile;
    QV_T *qp = (QV_T *)qbuf;
#ifdef QK_INT16
    float *qmul = (float *)(qp + heads * nd); /* per query head: its q scale * scale_qk */
    for (int64_t i = 0; i < heads; i++) qmul[i] = q16_prep(qp + i * nd, q + i * D, D) * s->scale_qk;
#else
    for (int64_t i = 0; i < heads * nd; i++) Q_PREP(qp + i, q + QK_W * i);
    const __m512 vscale = _mm512_set1_ps(s->scale_qk);
#endif
    pf_cursor pf = pf_start(s, r);
    pf_advance(s, r, &pf, PF_BYTES);
    for (int64_t pos = lo, cnt; pos < hi; pos += cnt) {
        cnt = chunk_len(pos, hi, bs);
        const int64_t slot = r->table[pos / bs] * bs + pos % bs;
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            const KV_T *kh = CHUNK_K(slot, hk);
#ifdef K_WIDEN
            K_WIDE_T kw[16 * ATT_MAX_D] __attribute__((aligned(64)));
            for (int64_t j = 0; j < cnt; j++)
                for (int64_t e = 0; e < nd; e++) K_WIDEN(kw + j * D + QK_W * e, kh + j * ROW_K + QK_W * e);
            const K_SRC_T *kr = kw;
#else
            const K_SRC_T *kr = kh;
#endif
#ifdef QK_INT16
            float ksc[16];
            for (int64_t j = 0; j < cnt; j++) ksc[j] = f16_scale(scale_ptr(s, 0, slot + j, hk));
            const __m512 kscale = _mm512_maskz_loadu_ps((__mmask16)((1u << cnt) - 1), ksc);
#endif
            for (int64_t g = 0; g < G; g++) {
                const int64_t i = (hk - r->h0) * G + g;
                const QV_T *qr = qp + i * nd;
                pf_advance(s, r, &pf, cnt * s->vb[0] * (g + 1) / G - cnt * s->vb[0] * g / G);
                ACC_T acc[16];
                for (int j = 0; j < 16; j++) acc[j] = ACC_ZERO;
                if (cnt == 16) {
#pragma GCC unroll 16
                    for (int64_t j = 0; j < 16; j++)
                        for (int64_t e = 0; e < nd; e++) acc[j] = K_DOT(acc[j], qr[e], kr + j * K_ROW + QK_W * e);
                } else {
#pragma GCC unroll 16
                    for (int64_t j = 0; j < 16; j++)
                        if (j < cnt)
                            for (int64_t e = 0; e < nd; e++)
                                acc[j] = K_DOT(acc[j], qr[e], kr + j * K_ROW + QK_W * e);
                }
#ifdef QK_INT16
                const __m512 vscale = _mm512_mul_ps(kscale, _mm512_set1_ps(qmul[i]));
#endif
                _mm512_mask_storeu_ps(scores + i * n + pos - lo, (__mmask16)((1u << cnt) - 1),
                                      _mm512_mul_ps(ACC_SUMS(acc), vscale));
            }
        }
    }
    soft_cap_all(scores, heads * n, s->softcap);
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
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            const V_T *vh = CHUNK_V(slot, hk);
            const int64_t i = (hk - r->h0) * G;
#ifdef V_SCALED
            float vsc[16];
            for (int64_t j = 0; j < cnt; j++) vsc[j] = f16_scale(scale_ptr(s, 1, slot + j, hk));
            const __mmask16 cmask = (__mmask16)((1u << cnt) - 1);
            const __m512 vscale = _mm512_maskz_loadu_ps(cmask, vsc);
#endif
            pf_advance(s, r, &pf, cnt * s->vb[1]);
            for (int64_t g = 0; g < G; g += V_HEADS(nd)) {
                const float *sp = scores + (i + g) * n + pos - lo;
                float *up = u + (i + g) * D;
                const int nh = G - g < V_HEADS(nd) ? (int)(G - g) : V_HEADS(nd);
                int64_t sn = n;
#ifdef V_SCALED
                float pv[4][16] __attribute__((aligned(64))); /* the chunk's weights times their V scales */
                for (int h = 0; h < nh; h++)
                    _mm512_store_ps(pv[h], _mm512_mul_ps(_mm512_maskz_loadu_ps(cmask, sp + h * n), vscale));
                sp = &pv[0][0], sn = 16;
#endif
                switch (nh) {
                case 1: CAT(FAST, _v)(vh, ROW_V, sp, sn, up, cnt, 1, QK_W * nd / 16); break;
                case 2: CAT(FAST, _v)(vh, ROW_V, sp, sn, up, cnt, 2, QK_W * nd / 16); break;
                case 3: CAT(FAST, _v)(vh, ROW_V, sp, sn, up, cnt, 3, QK_W * nd / 16); break;
                default: CAT(FAST, _v)(vh, ROW_V, sp, sn, up, cnt, 4, QK_W * nd / 16);
                }
            }
        }
    }
#ifdef V_ORDER
    for (int64_t i = 0; i < heads; i++) V_ORDER(u + i * D, D);
#endif
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

#undef ACC_T
#undef ACC_ZERO
#undef ACC_SUMS
#undef CHUNK_K
#undef CHUNK_V
#undef K_SRC_T
#undef K_ROW
#undef K_DOT
#undef ROW_K
#undef ROW_V
#ifdef V_T_DEFAULT
#undef V_T
#undef V_T_DEFAULT
#endif
