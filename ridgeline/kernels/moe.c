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
 * [format, data, scale, bias] as in decoder_stack.c (the router's and the experts' biases, where the model
 * has them, are added by the matmul). act (header): the experts' activation, 0 SiLU or 2 GPT-OSS's clamped
 * SwiGLU with act_params pointing at fp32 [alpha, limit]. counts (header, may be 0): int64 [E + 2] that
 * accumulates how many (token, slot) pairs each expert received (the per-expert load), then the
 * experts that ran (had a token) and the calls: experts touched per call = [E] / [E + 1].
 * dispatch (header, may be 0): a moe_dispatch_fn that computes the whole layer instead (expert
 * parallelism: experts on other ranks, tokens exchanged by the caller with the pieces below).
 *
 * The pieces, for a caller that moves the (token, slot) pairs itself between route and experts:
 *   ridgeline_moe_route    router, softmax, top-k and weights of T tokens
 *   ridgeline_moe_experts  experts over rows already grouped by expert (offsets per expert)
 *   ridgeline_moe_combine  weighted sum of the rows into their tokens, in row order
 *   ridgeline_moe_shared   the shared expert, added in place */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { LW_FIELDS = 4 };
enum { MD_EXPERTS, MD_TOPK, MD_INTER, MD_NORM_TOPK, MD_SHARED_INTER, MD_COUNTS, MD_DISPATCH, MD_ACT, MD_ACT_PARAMS,
       MD_ROUTER,
       MD_SHARED_GATE_UP = MD_ROUTER + LW_FIELDS, MD_SHARED_DOWN = MD_SHARED_GATE_UP + LW_FIELDS,
       MD_SHARED_GATE = MD_SHARED_DOWN + LW_FIELDS, MD_EXPERT0 = MD_SHARED_GATE + LW_FIELDS, MD_FIELDS = MD_EXPERT0 };

/* route(layer, probs [T, E], T, E, k, idx [T, k]): fill idx as torch.topk would; non-zero aborts */
typedef int (*moe_route_fn)(int64_t layer, const float *probs, int64_t T, int64_t E, int64_t k, int64_t *idx);
/* dispatch(layer, x [T, H], out [T, H], T, H): the whole layer; non-zero aborts */
typedef int (*moe_dispatch_fn)(int64_t layer, const float *x, float *out, int64_t T, int64_t H);

int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt);
int ridgeline_silu_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads);
int ridgeline_swiglu_clamp_mul(const float *gu, float *out, int64_t T, int64_t I, float alpha, float limit,
                               int nthreads);

/* the experts' activation: SiLU * up, or (MD_ACT 2) GPT-OSS's clamped SwiGLU with [alpha, limit] */
static void activate(const int64_t *desc, const float *gu, float *act, int64_t n, int64_t I, int nt) {
    if (desc[MD_ACT] == 2) {
        const float *ap = (const float *)(intptr_t)desc[MD_ACT_PARAMS];
        ridgeline_swiglu_clamp_mul(gu, act, n, I, ap[0], ap[1], nt);
    } else {
        ridgeline_silu_mul(gu, act, n, I, nt);
    }
}

int ridgeline_moe_fields(void) { return MD_FIELDS; }

/* floats of scratch for T tokens (int64 arrays take two floats an element) */
int64_t ridgeline_moe_scratch(const int64_t *desc, int64_t T, int64_t H) {
    const int64_t E = desc[MD_EXPERTS], k = desc[MD_TOPK], I = desc[MD_INTER], Is = desc[MD_SHARED_INTER];
    const int64_t R = T * k;
    return 2 * (2 * R + 3 * E + 1) + T * E + 2 * R + R * (2 * H + 3 * I) + (Is ? T * (3 * Is + H + 1) : 0);
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
 * expert equal to its k-th choice outside its top k (a tie whose resolution changes the set).
 * One pass over the experts, inserting into the sorted k kept so far: E compares a token, not E k^2. */
static int top_k(const float *p, int64_t T, int64_t E, int64_t k, int64_t *idx) {
    int tie = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *r = p + t * E;
        int64_t *ix = idx + t * k, n = 0;
        for (int64_t e = 0; e < E; e++) {
            const float v = r[e];
            if (n == k && !(v > r[ix[k - 1]])) continue;
            int64_t pos = n < k ? n++ : k - 1; /* full: the k-th is dropped */
            for (; pos > 0 && v > r[ix[pos - 1]]; pos--) ix[pos] = ix[pos - 1]; /* after its equals */
            ix[pos] = e;
        }
        const float kth = r[ix[k - 1]];
        for (int64_t e = 0; e < E && !tie; e++) {
            if (r[e] != kth) continue;
            int taken = 0;
            for (int64_t i = 0; i < k; i++) taken |= ix[i] == e;
            tie = !taken;
        }
    }
    return tie;
}

/* adds sigmoid(x @ shared_gate^T) * shared_expert(x) to out; buf: T * (3 Is + H + 1) floats */
int ridgeline_moe_shared(const int64_t *desc, const float *x, float *out, int64_t T, int64_t H, float *buf, int nt) {
    const int64_t Is = desc[MD_SHARED_INTER];
    float *gu = buf, *act = gu + T * 2 * Is, *y = act + T * Is, *g = y + T * H;
    int rc = ridgeline_stack_linear(desc + MD_SHARED_GATE_UP, x, gu, T, 2 * Is, H, nt);
    ridgeline_silu_mul(gu, act, T, Is, nt);
    rc |= ridgeline_stack_linear(desc + MD_SHARED_DOWN, act, y, T, H, Is, nt);
    rc |= ridgeline_stack_linear(desc + MD_SHARED_GATE, x, g, T, 1, H, nt);
    for (int64_t t = 0; t < T; t++) {
        const float s = 1.f / (1.f + expf(-g[t]));
        for (int64_t i = 0; i < H; i++) out[t * H + i] += s * y[t * H + i];
    }
    return rc;
}

/* expert e on its n rows starting at r0 of the grouped buffers */
static int expert(const int64_t *desc, int64_t e, int64_t r0, int64_t n, int64_t H, int64_t I, const float *xs,
                  float *gu, float *act, float *ys, int nt) {
    const int64_t *we = desc + MD_EXPERT0 + e * 2 * LW_FIELDS;
    int rc = ridgeline_stack_linear(we, xs + r0 * H, gu + r0 * 2 * I, n, 2 * I, H, nt);
    activate(desc, gu + r0 * 2 * I, act + r0 * I, n, I, nt);
    return rc | ridgeline_stack_linear(we + LW_FIELDS, act + r0 * I, ys + r0 * H, n, H, I, nt);
}

/* router, softmax, top-k: idx [T, k] (largest first), w [T, k] (renormalised where the model asks);
 * probs: T * E floats of scratch. The caller counts the load (it knows which rank's tokens these are). */
int ridgeline_moe_route(const int64_t *desc, const float *x, int64_t T, int64_t H, float *probs, int64_t *idx,
                        float *w, moe_route_fn route, int64_t layer, int nt) {
    const int64_t E = desc[MD_EXPERTS], k = desc[MD_TOPK];
    int rc = ridgeline_stack_linear(desc + MD_ROUTER, x, probs, T, E, H, nt);
    softmax_rows(probs, T, E);
    if (top_k(probs, T, E, k, idx) && (!route || route(layer, probs, T, E, k, idx))) return -4;
    for (int64_t t = 0; t < T; t++) {
        float s = 0.f;
        for (int64_t j = 0; j < k; j++) s += (w[t * k + j] = probs[t * E + idx[t * k + j]]);
        if (desc[MD_NORM_TOPK])
            for (int64_t j = 0; j < k; j++) w[t * k + j] /= s;
    }
    return rc;
}

/* rows xs [off[E], H] grouped by expert (expert e owns rows [off[e], off[e + 1])) -> ys [off[E], H].
 * An expert with more than a thread's share of the rows runs alone with the matmul threaded over
 * columns; the rest run side by side, one thread each (one parallel region for all of them: a
 * region per small matmul costs more than the matmul at decode). buf: E int64, then off[E] * 3 I
 * floats. Only experts with rows are read: a rank's descriptor may leave the others empty. */
int ridgeline_moe_experts(const int64_t *desc, const int64_t *off, const float *xs, float *ys, int64_t H, float *buf,
                          int nt) {
    const int64_t E = desc[MD_EXPERTS], I = desc[MD_INTER], R = off[E];
    int64_t *light = (int64_t *)buf, nlight = 0;
    float *gu = buf + 2 * E, *act = gu + R * 2 * I;
    int rc = 0;
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
    return rc;
}

/* out [T, H] = 0, then out[tok[r]] += wt[r] * ys[r] for r in order: rows in expert order make each
 * token sum its experts ascending */
void ridgeline_moe_combine(const int64_t *tok, const float *wt, const float *ys, int64_t R, float *out, int64_t T,
                           int64_t H) {
    memset(out, 0, sizeof(float) * (size_t)(T * H));
    for (int64_t r = 0; r < R; r++) {
        float *o = out + tok[r] * H;
        const float *y = ys + r * H, s = wt[r];
        for (int64_t i = 0; i < H; i++) o[i] += s * y[i];
    }
}

/* x [T, H] -> out [T, H]; buf: ridgeline_moe_scratch(desc, T, H) floats. Returns 0 or non-zero. */
int ridgeline_moe(const int64_t *desc, const float *x, float *out, int64_t T, int64_t H, float *buf,
                  moe_route_fn route, int64_t layer, int nt) {
    if (desc[MD_DISPATCH]) return ((moe_dispatch_fn)(intptr_t)desc[MD_DISPATCH])(layer, x, out, T, H);
    const int64_t E = desc[MD_EXPERTS], k = desc[MD_TOPK], I = desc[MD_INTER], R = T * k;
    int64_t *idx = (int64_t *)buf, *tok = idx + R, *count = tok + R, *off = count + E; /* int64 first: aligned */
    float *probs = (float *)(off + E + 1), *w = probs + T * E, *wt = w + R, *xs = wt + R, *gu = xs + R * H;
    float *ys = gu + 2 * E + R * 3 * I, *shared_buf = ys + R * H;
    int rc = ridgeline_moe_route(desc, x, T, H, probs, idx, w, route, layer, nt);
    if (rc) return rc;
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
    rc |= ridgeline_moe_experts(desc, off, xs, ys, H, gu, nt);
    ridgeline_moe_combine(tok, wt, ys, R, out, T, H);
    if (desc[MD_SHARED_INTER]) rc |= ridgeline_moe_shared(desc, x, out, T, H, shared_buf, nt);
    return rc;
}
