/* An EAGLE head's drafting (speculative/eagle.py) in two calls a step instead of dozens of small torch ops.
 *
 * ridgeline_eagle_step: the head's step for T rows: fc over [embedding, target hidden] (+ bias), then
 * its decoder layer through decoder_stack.c (layer 0 of a one-layer descriptor, the head's own
 * paged K/V: speculative/eagle_stack.py), then the residual added: features [T, H]; and where asked, the
 * copy pointer's query and key projections of the same rows.
 *
 * ridgeline_draft_pick: the draft decision (the torch reference is speculative/eagle_pointer.py's
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
 * A pointer reading exact matches (match = M > 0; speculative/eagle_pointer.py): each score gets
 * match_bias[L_j] (L_j: how many of the row's last tokens ctx[i][end_i], ctx[i][end_i - 1], ... equal
 * those ending at key j's, ctx[i][kpos[i][j] + 1], ..., in a row, at most M), and the gate reads
 * max_j L_j / M after its other inputs (gate [H + d + 4]); ctx, kpos [n] addresses of int64 arrays. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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
                            float *buf, float *moe_buf, moe_route_fn route, const int64_t *lora, int nt);

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
                                 NULL, NULL, stack_buf, NULL, NULL, NULL, nt);
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

/* A greedy drafting chain for n requests in one call: what EagleProposer.propose does for greedy
 * requests by calling the pick and the head's step in turn from Python (speculative/eagle.py), the same
 * calls on the same data in the same order (so the same drafts), without the interpreter between
 * them. Each step: the pick for every row; each row's chain goes on while its probabilities pass
 * the bars (a first draft's own probability min_first; the chain's product min_path, which the next
 * draft must also be able to pass) and it has drafted fewer than its k; then, unless every chain
 * stopped or k_max drafts were picked, the head's step for every row on its draft (its K/V at the
 * row's next head-cache slot, its pointer key at the memory's scratch row mem_n + s, its query into
 * chain_q), and the memory's scratch updated as speculative/eagle_memory.py's set_payload and chain do.
 *
 * a [CH_FIELDS] int64: the pick's and the step's arguments (pointers as integers; see the enum);
 * f [CF_FIELDS] double: scale, gate bias, eps, the head attention's scale, min_first, min_path;
 * rows [CR_FIELDS][n] int64: per row its first feature [H] and query [d] (addresses), its memory's
 * keys, payload, known, tokens (ctx), key positions (kpos), last token index (end), its last token,
 * its position, its k, mem_n, its head cache's length, then tables [n][nb] (its head cache's blocks,
 * enough for the chain's steps); -> tokens [n][k_max] (a row's first counts[i] are its drafts),
 * counts [n]. Returns 0, -2 out of memory, or a kernel's error. */
enum { CH_ROWS_W, CH_FEATS, CH_LOGITS, CH_H, CH_V, CH_VOCAB_IDS, CH_VOCAB_INDEX, CH_D, CH_GATE, CH_MASS, CH_WORK,
       CH_MATCH, CH_MATCH_BIAS, CH_FC, CH_TABLE, CH_TABLE_FMT, CH_TABLE_V, CH_DIMS, CH_LAYER, CH_COS_SIN, CH_QK_W,
       CH_QK, CH_D2, CH_X, CH_BUF, CH_CHAIN_Q, CH_N, CH_K_MAX, CH_NB, CH_FIELDS };
enum { CF_SCALE, CF_GATE_B, CF_EPS, CF_ATTN_SCALE, CF_MIN_FIRST, CF_MIN_PATH, CF_FIELDS };
enum { CR_FEAT, CR_QUERY, CR_KEYS, CR_PAYLOAD, CR_KNOWN, CR_CTX, CR_KPOS, CR_END, CR_OWN, CR_POS, CR_K, CR_MEM_N,
       CR_CACHE_LEN, CR_FIELDS };

int ridgeline_chain_fields(int which) { return which == 0 ? CH_FIELDS : which == 1 ? CF_FIELDS : which == 2 ? CR_FIELDS : -1; }

int ridgeline_eagle_chain(const int64_t *a, const double *f, const int64_t *rows, int64_t *tokens, int64_t *counts,
                          int nt) {
    const int64_t n = a[CH_N], k_max = a[CH_K_MAX], nb = a[CH_NB], H = a[CH_H], d = a[CH_D], match = a[CH_MATCH];
    const int pointer = d > 0; /* a copy pointer: queries, keys, payloads */
    const int64_t *feat0 = rows + CR_FEAT * n, *q0 = rows + CR_QUERY * n, *known = rows + CR_KNOWN * n,
                  *end0 = rows + CR_END * n, *own0 = rows + CR_OWN * n, *pos0 = rows + CR_POS * n, *kk = rows + CR_K * n,
                  *mem_n = rows + CR_MEM_N * n, *clen = rows + CR_CACHE_LEN * n, *tables = rows + CR_FIELDS * n;
    /* per step: feat_rows, q_rows, m, end, picked, own, positions, slots, row_seq, key_lens [n each], dst [3n], group */
    int64_t *w = malloc(sizeof(int64_t) * (size_t)(13 * n + 8));
    double *path = malloc(sizeof(double) * (size_t)n);
    char *stopped = malloc((size_t)n);
    float *probs = malloc(sizeof(float) * (size_t)n);
    int rc = (!w || !path || !stopped || !probs) ? -2 : 0;
    int64_t *feat_rows = w, *q_rows = w + n, *m = w + 2 * n, *end = w + 3 * n, *picked = w + 4 * n, *own = w + 5 * n,
            *positions = w + 6 * n, *slots = w + 7 * n, *row_seq = w + 8 * n, *key_lens = w + 9 * n, *dst = w + 10 * n,
            *group = w + 13 * n;
    const float *x = PTR(const float, a[CH_X]), *chain_q = PTR(const float, a[CH_CHAIN_Q]);
    for (int64_t i = 0; i < n && !rc; i++) {
        path[i] = 1.0, stopped[i] = 0, counts[i] = 0;
        feat_rows[i] = feat0[i], q_rows[i] = q0[i], own[i] = own0[i], row_seq[i] = i;
    }
    for (int64_t s = 0; s < k_max && !rc; s++) {
        for (int64_t i = 0; i < n; i++) {
            m[i] = pointer ? known[i] + s : 0;
            end[i] = end0[i] + s;
        }
        rc = ridgeline_draft_pick(PTR(const int64_t, a[CH_ROWS_W]), feat_rows, PTR(float, a[CH_FEATS]),
                                  PTR(float, a[CH_LOGITS]), n, H, a[CH_V], PTR(const int64_t, a[CH_VOCAB_IDS]),
                                  PTR(const int64_t, a[CH_VOCAB_INDEX]), pointer ? q_rows : NULL,
                                  rows + CR_KEYS * n, rows + CR_PAYLOAD * n, m, d, (float)f[CF_SCALE],
                                  PTR(const float, a[CH_GATE]), (float)f[CF_GATE_B], PTR(float, a[CH_MASS]),
                                  PTR(float, a[CH_WORK]), picked, probs, match ? rows + CR_CTX * n : NULL,
                                  match ? rows + CR_KPOS * n : NULL, match ? end : NULL, match,
                                  PTR(const float, a[CH_MATCH_BIAS]), nt);
        if (rc) break;
        int going = 0;
        for (int64_t i = 0; i < n; i++) { /* the gating of speculative/eagle.py's propose, in the same double arithmetic */
            path[i] *= (double)probs[i];
            const double bar = s == 0 ? f[CF_MIN_FIRST] : f[CF_MIN_PATH];
            stopped[i] = stopped[i] || path[i] < bar || s >= kk[i];
            if (!stopped[i]) tokens[i * k_max + counts[i]++] = picked[i];
            stopped[i] = stopped[i] || path[i] < f[CF_MIN_PATH] || s + 1 >= kk[i];
            going |= !stopped[i];
        }
        if (s + 1 == k_max || !going) break;
        /* the head's step on every row's draft (HeadStack._run's arguments for one row each) */
        const int64_t bs = PTR(const int64_t, a[CH_DIMS])[6], kb = 4 * d;
        for (int64_t i = 0; i < n; i++) {
            const int64_t j = clen[i] + s, *tb = tables + i * nb;
            positions[i] = pos0[i] + s;
            slots[i] = tb[j / bs] * bs + j % bs;
            key_lens[i] = j + 1;
            dst[i] = pointer ? rows[CR_KEYS * n + i] + kb * (mem_n[i] + s) : 0;
            dst[n + i] = pointer ? (int64_t)(intptr_t)(chain_q + d * i) : 0;
            dst[2 * n + i] = 0;
        }
        group[0] = 0, group[1] = n, group[2] = (int64_t)(intptr_t)tables, group[3] = nb;
        group[4] = (int64_t)(intptr_t)row_seq, group[5] = (int64_t)(intptr_t)key_lens, group[6] = 0;
        rc = ridgeline_eagle_step(PTR(const int64_t, a[CH_FC]), feat_rows, NULL, NULL, PTR(const void, a[CH_TABLE]),
                                  a[CH_TABLE_FMT], a[CH_TABLE_V], picked, pointer ? own : NULL, PTR(float, a[CH_X]),
                                  PTR(const int64_t, a[CH_DIMS]), (float)f[CF_EPS], (float)f[CF_ATTN_SCALE],
                                  PTR(const int64_t, a[CH_LAYER]), PTR(const float, a[CH_COS_SIN]), n, positions, slots,
                                  group, pointer ? PTR(const int64_t, a[CH_QK_W]) : NULL,
                                  pointer ? PTR(float, a[CH_QK]) : NULL, pointer ? a[CH_D2] : 0, dst,
                                  PTR(float, a[CH_BUF]), nt);
        if (rc) break;
        for (int64_t i = 0; i < n; i++) {
            if (pointer) { /* the new position's token is the previous key's payload; the key's position, the chain's token */
                PTR(int64_t, rows[CR_PAYLOAD * n + i])[known[i] + s] = picked[i];
                if (match) {
                    PTR(int64_t, rows[CR_KPOS * n + i])[mem_n[i] + s] = pos0[i] + s;
                    PTR(int64_t, rows[CR_CTX * n + i])[pos0[i] + 1 + s] = picked[i];
                }
            }
            feat_rows[i] = (int64_t)(intptr_t)(x + H * i);
            q_rows[i] = (int64_t)(intptr_t)(chain_q + d * i);
            own[i] = picked[i];
        }
    }
    free(w), free(path), free(stopped), free(probs);
    return rc;
}

/* dst row dst_rows[i] = src row src_rows[i] for i < n, rows of row_bytes bytes (the target's hidden
 * rows an EAGLE head keeps beside the KV cache, speculative/eagle_context.py: a step's rows in one call) */
void ridgeline_copy_rows(char *dst, const char *src, const int64_t *dst_rows, const int64_t *src_rows, int64_t n,
                         int64_t row_bytes) {
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + dst_rows[i] * row_bytes, src + src_rows[i] * row_bytes, (size_t)row_bytes);
}
