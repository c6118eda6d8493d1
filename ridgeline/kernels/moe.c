/* A sparse (mixture-of-experts) MLP for one step, grouped by expert:
 *   router:  logits [T, E] = x @ router^T; probs = softmax(logits) per token (fp32)
 *   top-k:   the k largest probs per token, largest first; weights = those probs, renormalised to sum
 *            to 1 when the model asks (norm_topk). A tie at the k-th place is settled by the caller's
 *            route callback (torch.topk, which is what transformers uses), so the chosen set matches.
 *   group:   (token, slot) pairs counting-sorted by expert, tokens ascending inside an expert;
 *            each expert with tokens runs one gate_up matmul, SiLU * up and one down matmul over
 *            just its rows (the same packed kernels as a dense MLP), in expert order
 *   combine: out[t] = sum over the token's experts, ascending, of weight * expert output
 *            (+ sigmoid(x @ shared_gate^T) * shared_expert(x) when the model has a shared expert)
 * Every output row is computed by the same kernels in the same order whatever else is in the batch.
 *
 * desc (int64): [MD_FIELDS] header, then per expert two weight descriptors (gate_up, down), each
 * [format, data, scale, bias] as in decoder_stack.c. counts (header, may be 0): int64 [E + 2] that
 * accumulates how many (token, slot) pairs each expert received (the per-expert load), then the
 * experts that ran (had a token) and the calls: experts touched per call = [E] / [E + 1]. */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { LW_FIELDS = 4 };
enum { MD_EXPERTS, MD_TOPK, MD_INTER, MD_NORM_TOPK, MD_SHARED_INTER, MD_COUNTS, MD_ROUTER,
       MD_SHARED_GATE_UP = MD_ROUTER + LW_FIELDS, MD_SHARED_DOWN = MD_SHARED_GATE_UP + LW_FIELDS,
       MD_SHARED_GATE = MD_SHARED_DOWN + LW_FIELDS, MD_EXPERT0 = MD_SHARED_GATE + LW_FIELDS, MD_FIELDS = MD_EXPERT0 };

/* route(layer, probs [T, E], T, E, k, idx [T, k]): fill idx as torch.topk would; non-zero aborts */
typedef int (*moe_route_fn)(int64_t layer, const float *probs, int64_t T, int64_t E, int64_t k, int64_t *idx);

int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt);
int ridgeline_silu_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads);

int ridgeline_moe_fields(void) { return MD_FIELDS; }

/* floats of scratch for T tokens (int64 arrays take two floats an element) */
int64_t ridgeline_moe_scratch(const int64_t *desc, int64_t T, int64_t H) {
    const int64_t E = desc[MD_EXPERTS], k = desc[MD_TOPK], I = desc[MD_INTER], Is = desc[MD_SHARED_INTER];
    const int64_t R = T * k;
    return 2 * (2 * R + 2 * E + 1) + T * E + 2 * R + R * (2 * H + 3 * I) + (Is ? T * (3 * Is + H + 1) : 0);
}

static void softmax_rows(float *p, int64_t T, int64_t E) {
    for (int64_t t = 0; t < T; t++) {
        float *r = p + t * E, m = r[0], s = 0.f;
        for (int64_t e = 1; e < E; e++) m = r[e] > m ? r[e] : m;
        for (int64_t e = 0; e < E; e++) s += (r[e] = expf(r[e] - m));
        for (int64_t e = 0; e < E; e++) r[e] /= s;
    }
}

/* idx [T, k]: largest first, the lower index on equal values; returns 1 if some token has another
 * expert equal to its k-th choice outside its top k (a tie whose resolution changes the set) */
static int top_k(const float *p, int64_t T, int64_t E, int64_t k, int64_t *idx) {
    int tie = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *r = p + t * E;
        int64_t *ix = idx + t * k;
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j; i++) taken |= ix[i] == e;
                if (!taken && (best < 0 || r[e] > r[best])) best = e;
            }
            ix[j] = best;
        }
        const float kth = r[ix[k - 1]];
        for (int64_t e = 0; e < E && !tie; e++) {
            int taken = 0;
            for (int64_t i = 0; i < k; i++) taken |= ix[i] == e;
            tie = !taken && r[e] == kth;
        }
    }
    return tie;
}

static void shared_expert(const int64_t *desc, const float *x, float *out, int64_t T, int64_t H, float *buf,
                          int nt, int *rc) {
    const int64_t Is = desc[MD_SHARED_INTER];
    float *gu = buf, *act = gu + T * 2 * Is, *y = act + T * Is, *g = y + T * H;
    *rc |= ridgeline_stack_linear(desc + MD_SHARED_GATE_UP, x, gu, T, 2 * Is, H, nt);
    ridgeline_silu_mul(gu, act, T, Is, nt);
    *rc |= ridgeline_stack_linear(desc + MD_SHARED_DOWN, act, y, T, H, Is, nt);
    *rc |= ridgeline_stack_linear(desc + MD_SHARED_GATE, x, g, T, 1, H, nt);
    for (int64_t t = 0; t < T; t++) {
        const float s = 1.f / (1.f + expf(-g[t]));
        for (int64_t i = 0; i < H; i++) out[t * H + i] += s * y[t * H + i];
    }
}

/* expert e on its n rows starting at r0 of the grouped buffers */
static int expert(const int64_t *desc, int64_t e, int64_t r0, int64_t n, int64_t H, int64_t I, const float *xs,
                  float *gu, float *act, float *ys, int nt) {
    const int64_t *we = desc + MD_EXPERT0 + e * 2 * LW_FIELDS;
    int rc = ridgeline_stack_linear(we, xs + r0 * H, gu + r0 * 2 * I, n, 2 * I, H, nt);
    ridgeline_silu_mul(gu + r0 * 2 * I, act + r0 * I, n, I, nt);
    return rc | ridgeline_stack_linear(we + LW_FIELDS, act + r0 * I, ys + r0 * H, n, H, I, nt);
}

/* x [T, H] -> out [T, H]; buf: ridgeline_moe_scratch(desc, T, H) floats. Returns 0 or non-zero. */
int ridgeline_moe(const int64_t *desc, const float *x, float *out, int64_t T, int64_t H, float *buf,
                  moe_route_fn route, int64_t layer, int nt) {
    const int64_t E = desc[MD_EXPERTS], k = desc[MD_TOPK], I = desc[MD_INTER], R = T * k;
    int64_t *idx = (int64_t *)buf, *tok = idx + R, *count = tok + R, *off = count + E; /* int64 first: aligned */
    float *probs = (float *)(off + E + 1), *w = probs + T * E, *wt = w + R, *xs = wt + R, *gu = xs + R * H;
    float *act = gu + R * 2 * I, *ys = act + R * I;
    float *shared_buf = ys + R * H;
    int rc = ridgeline_stack_linear(desc + MD_ROUTER, x, probs, T, E, H, nt);
    softmax_rows(probs, T, E);
    if (top_k(probs, T, E, k, idx) && (!route || route(layer, probs, T, E, k, idx))) return -4;
    for (int64_t t = 0; t < T; t++) {
        float s = 0.f;
        for (int64_t j = 0; j < k; j++) s += (w[t * k + j] = probs[t * E + idx[t * k + j]]);
        if (desc[MD_NORM_TOPK])
            for (int64_t j = 0; j < k; j++) w[t * k + j] /= s;
    }
    memset(count, 0, sizeof(int64_t) * (size_t)E);
    for (int64_t r = 0; r < R; r++) count[idx[r]]++;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + count[e];
    if (desc[MD_COUNTS]) {
        int64_t *acc = (int64_t *)(intptr_t)desc[MD_COUNTS];
        for (int64_t e = 0; e < E; e++) acc[e] += count[e], acc[E] += count[e] > 0;
        acc[E + 1]++;
    }
    for (int64_t e = 0; e < E; e++) count[e] = off[e]; /* now the next free position per expert */
    for (int64_t r = 0; r < R; r++) {
        const int64_t pos = count[idx[r]]++;
        tok[pos] = r / k;
        wt[pos] = w[r];
        memcpy(xs + pos * H, x + (r / k) * H, sizeof(float) * (size_t)H);
    }
    /* each expert over its own rows: one with more than a thread's share of the rows runs alone with
     * the matmul threaded over columns; the rest run side by side, one thread each (one parallel
     * region for all of them: a region per small matmul costs more than the matmul at decode) */
    int64_t *light = count, nlight = 0; /* reuses count: positions are in off now */
    for (int64_t e = 0; e < E; e++) {
        const int64_t n = off[e + 1] - off[e];
        if (!n) continue;
        if (n * nt > R && nt > 1) rc |= expert(desc, e, off[e], n, H, I, xs, gu, act, ys, nt);
        else light[nlight++] = e;
    }
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nlight > 1) reduction(| : rc)
    for (int64_t i = 0; i < nlight; i++)
        rc |= expert(desc, light[i], off[light[i]], off[light[i] + 1] - off[light[i]], H, I, xs, gu, act, ys,
                     nlight > 1 ? 1 : nt);
    memset(out, 0, sizeof(float) * (size_t)(T * H));
    for (int64_t r = 0; r < R; r++) { /* expert order, so each token sums its experts ascending */
        float *o = out + tok[r] * H;
        const float *y = ys + r * H, s = wt[r];
        for (int64_t i = 0; i < H; i++) o[i] += s * y[i];
    }
    if (desc[MD_SHARED_INTER]) shared_expert(desc, x, out, T, H, shared_buf, nt, &rc);
    return rc;
}
