/* An EAGLE head's drafting (spec/eagle.py) in two calls a step instead of dozens of small torch ops.
 *
 * ridgeline_eagle_step: the head's step for T rows: fc over [embedding, target hidden] (+ bias), then
 * its decoder layer through decoder_stack.c (layer 0 of a one-layer descriptor, the head's own
 * paged K/V: spec/eagle_stack.py), then the residual added: features [T, H]; and where asked, the
 * copy pointer's query and key projections of the same rows.
 *
 * ridgeline_draft_pick: the draft decision (the torch reference is spec/eagle_pointer.py's
 * CopyPointer.attend + pick): for each of n rows, the head's logits over its
 * draft vocabulary (one matmul by the weight descriptor of its LM-head rows), their softmax's top
 * token and probability, and where the row has a copy pointer's context, the pointer's mixture
 *
 *     p(v) = (1 - g) p_head(v) + g sum_{j: payload_j = v} a_j,   a = softmax(scale q.K^T)
 *     g = sigmoid(w . [feat, a K, max score, max a, p_head's top] + b)
 *
 * whose best token among the head's top and the payload tokens is the draft: a payload token wins
 * only when its mixture probability is strictly above the head's top token's (ties: the head's; among
 * payload positions the first best), as pick() decides. Shapes: feat_rows [n] addresses of fp32 rows
 * [H] (gathered into feats [n, H] scratch), logits [n, V] scratch, vocab_ids [V] (NULL: row = token),
 * vocab_index [vocab] a token's row or -1 (NULL: identity), q_rows [n] addresses of fp32 queries [d],
 * keys[i] [m_i, d] fp32 and payload[i] [m_i] int64 by address (m_i = 0 or q_rows NULL: no pointer),
 * gate [H + d + 3] and its bias, mass [vocab] fp32 zeros (left zero), work [max m_i + d] fp32.
 * A pointer reading exact matches (match = M > 0; spec/eagle_pointer.py): each score gets
 * match_bias[L_j] (L_j: how many of the row's last tokens ctx[i][end_i], ctx[i][end_i - 1], ... equal
 * those ending at key j's, ctx[i][kpos[i][j] + 1], ..., in a row, at most M), and the gate reads
 * max_j L_j / M after its other inputs (gate [H + d + 4]); ctx, kpos [n] addresses of int64 arrays. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include "vexp.h"
#endif

int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt);
typedef int (*stack_hook)(int64_t layer, int64_t where, float *x, int64_t T, int64_t H);
typedef int (*moe_route_fn)(int64_t layer, const float *probs, int64_t T, int64_t E, int64_t k, int64_t *idx);
int ridgeline_decoder_stack(const int64_t *dims, float eps, float scale, const int64_t *layers, int64_t first,
                            int64_t last, const float *cos_sin, const float *final_norm, float *x, float *out,
                            int hidden_in, int64_t T, const int64_t *positions, const int64_t *slots,
                            const int64_t *groups, int64_t ngroups, const int64_t *capture, stack_hook hook,
                            float *buf, float *moe_buf, moe_route_fn route, int nt);

#define PTR(T, v) ((T *)(intptr_t)(v))

/* The rows' inputs: hidden [T] addresses of fp32 rows [H] (the target's hidden states, or a chain's
 * features); their next tokens' embeddings emb [T, H] fp32, or (emb NULL) rows ids [T] of the
 * embedding table (ridgeline_embed's formats; V rows); with a copy pointer (qk_w non-NULL) also the
 * rows' own tokens' embeddings own_emb, or rows own [T] of the table. fc: weight descriptor [2H -> H]
 * with its bias; x [T, H] out (the features); buf: T * 6H + ridgeline_stack_scratch(dims, T) floats.
 * The rest as ridgeline_decoder_stack, one group. With qk_w ([4H -> 2d] with its bias), also the copy
 * pointer's queries and keys of the rows, qk [T, 2d], from u = [emb, own_emb, hidden, x]. dst (or
 * NULL): [3, T] addresses each row's key [d], query [d] and feature [H] are also copied to (0: not),
 * so a caller's per-request buffers get them without another pass. Returns 0, -1 for a token id
 * outside the table, or a kernel's error. */
int ridgeline_embed(const void *table, int fmt, const int64_t *ids, int64_t T, int64_t V, int64_t H, float *out);
static int eagle_step(const int64_t *fc, const int64_t *hidden, const float *emb, const float *own_emb,
                      const void *table, int64_t table_fmt, int64_t V, const int64_t *ids, const int64_t *own,
                      float *x, const int64_t *dims, float eps, float scale, const int64_t *layer,
                      const float *cos_sin, int64_t T, const int64_t *positions, const int64_t *slots,
                      const int64_t *group, const int64_t *qk_w, float *qk, int64_t d2, float *buf, int nt);

int ridgeline_eagle_step(const int64_t *fc, const int64_t *hidden, const float *emb, const float *own_emb,
                         const void *table, int64_t table_fmt, int64_t V, const int64_t *ids, const int64_t *own,
                         float *x, const int64_t *dims, float eps, float scale, const int64_t *layer,
                         const float *cos_sin, int64_t T, const int64_t *positions, const int64_t *slots,
                         const int64_t *group, const int64_t *qk_w, float *qk, int64_t d2, const int64_t *dst,
                         float *buf, int nt) {
    int rc = eagle_step(fc, hidden, emb, own_emb, table, table_fmt, V, ids, own, x, dims, eps, scale, layer, cos_sin, T,
                        positions, slots, group, qk_w, qk, d2, buf, nt);
    if (rc || !dst) return rc;
    /* dst [3, T]: where each row's key, query and feature go besides qk and x (0: nowhere) */
    const int64_t H = dims[1], d = d2 / 2;
    for (int64_t t = 0; t < T; t++) {
        if (dst[t] && qk) memcpy(PTR(float, dst[t]), qk + t * d2 + d, sizeof(float) * (size_t)d);
        if (dst[T + t] && qk) memcpy(PTR(float, dst[T + t]), qk + t * d2, sizeof(float) * (size_t)d);
        if (dst[2 * T + t]) memcpy(PTR(float, dst[2 * T + t]), x + t * H, sizeof(float) * (size_t)H);
    }
    return 0;
}

static int eagle_step(const int64_t *fc, const int64_t *hidden, const float *emb, const float *own_emb,
                      const void *table, int64_t table_fmt, int64_t V, const int64_t *ids, const int64_t *own,
                      float *x, const int64_t *dims, float eps, float scale, const int64_t *layer,
                      const float *cos_sin, int64_t T, const int64_t *positions, const int64_t *slots,
                      const int64_t *group, const int64_t *qk_w, float *qk, int64_t d2, float *buf, int nt) {
    const int64_t H = dims[1];
    const size_t row = sizeof(float) * (size_t)H;
    float *cat = buf, *out = cat + 4 * T * H, *e = out + T * H, *stack_buf = e + T * H;
    if (!emb) { /* the lookups, into the scratch the stack reuses later (e then holds the own tokens') */
        if (ridgeline_embed(table, (int)table_fmt, ids, T, V, H, e)) return -1;
        emb = e;
    }
    for (int64_t t = 0; t < T; t++) {
        memcpy(cat + 2 * t * H, emb + t * H, row);
        memcpy(cat + (2 * t + 1) * H, PTR(const float, hidden[t]), row);
    }
    int rc = ridgeline_stack_linear(fc, cat, x, T, H, 2 * H, nt);
    if (rc) return rc;
    /* cat's first 2TH floats keep the [emb, hidden] rows the pointer reads below */
    float *u_emb = cat;
    rc = ridgeline_decoder_stack(dims, eps, scale, layer, 0, 1, cos_sin, NULL, x, out, 0, T, positions, slots, group, 1,
                                 NULL, NULL, stack_buf, NULL, NULL, nt);
    if (rc) return rc;
    for (int64_t i = 0; i < T * H; i++) x[i] += out[i];
    if (!qk_w) return 0;
    if (!own_emb) {
        if (ridgeline_embed(table, (int)table_fmt, own, T, V, H, e)) return -1;
        own_emb = e;
    }
    /* u rows [emb, own, hidden, x] built from the last row back, so the [emb, hidden] pairs in cat's
     * front are read before they are overwritten (row t's u starts at 4tH, its pair at 2tH) */
    for (int64_t t = T - 1; t >= 0; t--) {
        float *u = cat + 4 * t * H;
        memmove(u + 2 * H, u_emb + (2 * t + 1) * H, row);
        memmove(u, u_emb + 2 * t * H, row);
        memcpy(u + H, own_emb + t * H, row);
        memcpy(u + 3 * H, x + t * H, row);
    }
    return ridgeline_stack_linear(qk_w, cat, qk, T, d2, 4 * H, nt);
}

/* l [V]'s first largest value's index and value, and 1 / sum exp(l - max): its softmax probability.
 * Vectorized where AVX-512 runs (a draft's 8,192 logits: scalar expf took tens of microseconds a row). */
static void softmax_top(const float *l, int64_t V, int64_t *top, float *mx, float *ptop) {
    int64_t v = 0, t = 0;
    float m = l[0];
    double z = 0.0;
#ifdef __AVX512F__
    if (V >= 16) {
        __m512 vm = _mm512_loadu_ps(l);
        for (v = 16; v + 16 <= V; v += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(l + v));
        m = _mm512_reduce_max_ps(vm);
        for (; v < V; v++) m = l[v] > m ? l[v] : m;
        for (t = 0; t < V && l[t] != m; t++) {}
        if (t == V) t = 0; /* NaN logits: no draft worth having, any row */
        const __m512 vmx = _mm512_set1_ps(m);
        __m512 vz = _mm512_setzero_ps();
        for (v = 0; v + 16 <= V; v += 16) vz = _mm512_add_ps(vz, vexp512(_mm512_sub_ps(_mm512_loadu_ps(l + v), vmx)));
        z = _mm512_reduce_add_ps(vz);
        for (; v < V; v++) z += expf(l[v] - m);
        *top = t, *mx = m, *ptop = (float)(1.0 / z);
        return;
    }
#endif
    for (v = 1; v < V; v++)
        if (l[v] > m) m = l[v], t = v;
    for (v = 0; v < V; v++) z += expf(l[v] - m);
    *top = t, *mx = m, *ptop = (float)(1.0 / z);
}

int ridgeline_draft_pick(const int64_t *rows_w, const int64_t *feat_rows, float *feats, float *logits, int64_t n,
                         int64_t H, int64_t V, const int64_t *vocab_ids, const int64_t *vocab_index,
                         const int64_t *q_rows, const int64_t *keys, const int64_t *payload, const int64_t *m,
                         int64_t d, float scale, const float *gate, float gate_b, float *mass, float *work,
                         int64_t *tokens, float *probs, const int64_t *ctx, const int64_t *kpos, const int64_t *end,
                         int64_t match, const float *match_bias, int nt) {
    for (int64_t i = 0; i < n; i++) memcpy(feats + i * H, PTR(const float, feat_rows[i]), sizeof(float) * (size_t)H);
    int rc = ridgeline_stack_linear(rows_w, feats, logits, n, V, H, nt);
    if (rc) return rc;
    for (int64_t i = 0; i < n; i++) {
        const float *l = logits + i * V;
        int64_t top;
        float mx, ptop;
        softmax_top(l, V, &top, &mx, &ptop);
        const int64_t token = vocab_ids ? vocab_ids[top] : top;
        tokens[i] = token, probs[i] = ptop;
        const int64_t mi = q_rows ? m[i] : 0;
        if (mi <= 0) continue;
        const float *K = PTR(const float, keys[i]), *qi = PTR(const float, q_rows[i]);
        const int64_t *pay = PTR(const int64_t, payload[i]);
        float *a = work, *ctx_v = work + mi, smax = -INFINITY;
        const int64_t *tok = match ? PTR(const int64_t, ctx[i]) : NULL, *kp = match ? PTR(const int64_t, kpos[i]) : NULL;
        int64_t longest = 0;
        for (int64_t j = 0; j < mi; j++) {
            float s = 0.f;
            for (int64_t c = 0; c < d; c++) s += qi[c] * K[j * d + c];
            a[j] = s * scale;
            if (match) { /* the match length with the row's context, its bias */
                const int64_t e = end[i], k = kp[j] + 1;
                int64_t L = 0;
                while (L < match && k - L >= 0 && e - L >= 0 && tok[k - L] == tok[e - L]) L++;
                a[j] += match_bias[L];
                longest = L > longest ? L : longest;
            }
            smax = a[j] > smax ? a[j] : smax;
        }
        double sa = 0.0;
        for (int64_t j = 0; j < mi; j++) sa += (a[j] = expf(a[j] - smax));
        const float inv = (float)(1.0 / sa);
        for (int64_t c = 0; c < d; c++) ctx_v[c] = 0.f;
        for (int64_t j = 0; j < mi; j++) {
            a[j] *= inv;
            for (int64_t c = 0; c < d; c++) ctx_v[c] += a[j] * K[j * d + c];
        }
        float x = gate_b;
        const float *f = feats + i * H;
        for (int64_t c = 0; c < H; c++) x += gate[c] * f[c];
        for (int64_t c = 0; c < d; c++) x += gate[H + c] * ctx_v[c];
        x += gate[H + d] * smax + gate[H + d + 1] * inv + gate[H + d + 2] * ptop;  /* max a = exp(0) / sa */
        if (match) x += gate[H + d + 3] * ((float)longest / (float)match);
        const float g = 1.f / (1.f + expf(-x));
        if (!(g > 0.f)) continue;
        for (int64_t j = 0; j < mi; j++) mass[pay[j]] += a[j];
        float best = -1.f, top_score = (1.f - g) * ptop + g * mass[token];
        int64_t best_tok = -1;
        for (int64_t j = 0; j < mi; j++) {
            const int64_t r = vocab_index ? vocab_index[pay[j]] : pay[j];
            const float own = r >= 0 ? expf(l[r] - mx) * ptop : 0.f;
            const float score = g * mass[pay[j]] + (1.f - g) * own;
            if (score > best) best = score, best_tok = pay[j];
        }
        for (int64_t j = 0; j < mi; j++) mass[pay[j]] = 0.f;
        if (best > top_score)
            tokens[i] = best_tok, probs[i] = best;
        else
            probs[i] = top_score;
    }
    return 0;
}
