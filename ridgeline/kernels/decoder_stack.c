/* Layers [first, last) of a Llama-family decoder for one step, in one call from Python: for every
 * layer RMSNorm (+ residual) -> qkv matmul (+ bias) -> [per-head q/k RMSNorm] -> rotary + KV write ->
 * paged attention -> o matmul (+ bias) -> [hook] -> RMSNorm + residual -> MLP -> [hook] -> [capture],
 * then optionally the final norm. The MLP is dense (gate_up matmul -> SiLU * up -> down matmul) or,
 * where the layer has a MoE descriptor, the grouped sparse MLP of moe.c. It calls the same kernels, in the same
 * order and on the same data, as the Python modules do one op at a time (models/llama.py), so the
 * results are bitwise identical; what it saves is the interpreter and dispatch cost between them.
 *
 * Everything is driven by descriptors (int64 arrays, pointers as integers):
 * dims:    [layers, hidden, heads, kv_heads, head_dim, intermediate, block_size]
 * layers:  [layers][LP_FIELDS]: norms, window, KV formats (K | V << 8, kv_quant.h) + cache and fp16
 *          scale pointers (0 for float formats), q/k norm weights [head_dim] (0: none), the MoE
 *          descriptor (moe.c; 0: a dense MLP), the K centers [3, Hkv, D] (0: none; rows 0-1 for rope_kv,
 *          row 2 the key-0 offset of the attention kernels, paged_src.h), the sandwich norms on the
 *          attention and MLP outputs (0: none; Gemma 2/3), the MLP activation (0 SiLU, 1 GELU-tanh, 2 clamped SwiGLU),
 *          the layer's rotary table [positions, head_dim / 2, 2] (0: the stack's own; Gemma 3's
 *          local layers have their own base), the attention logit soft-cap (a pointer to one float; 0:
 *          none; Gemma 2), the attention sinks [heads] (0: none; GPT-OSS), the activation's parameters
 *          (fp32 [alpha, limit] of the clamped SwiGLU, activation 2; GPT-OSS), the layer's KV group (its
 *          slots and groups are row kv_group of each: 0 with one table for every layer), and for each of the four
 *          linears a weight descriptor
 *          [format, data, scale, bias] (bias may be 0)
 * slots:   [KV groups][T]: each new token's cache slot in each KV group's pages
 * groups:  [KV groups][ngroups][GP_FIELDS]: attention groups over the flattened rows, as the runner builds them
 * capture: NULL, or [layers] pointers: where non-zero, the hidden state after that layer (residual
 *          stream + MLP output) [T, hidden] is written there
 * hook:    NULL, or called in place on the attention output (where 0) and the MLP output (where 1)
 *          of each layer, after the bias: where tensor parallelism all-reduces. Non-zero aborts.
 * route:   NULL, or the MoE tie-breaker (moe.c), called only when a token's k-th expert ties.
 * lora:    NULL, or [row slots [T] (int64, -1: none), tables [layers][4]]: per-row low-rank additions (LoRA
 *          adapters) after each linear's matmul and bias, where its table pointer is non-zero (lora_add.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "kv_quant.h"

int ridgeline_rmsnorm(const float *x, float *residual, const float *w, float *out, int64_t T, int64_t H, float eps,
                      int nthreads);
int ridgeline_silu_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads);
int ridgeline_gelu_tanh_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads);
int ridgeline_swiglu_clamp_mul(const float *gu, float *out, int64_t T, int64_t I, float alpha, float limit,
                               int nthreads);
int ridgeline_rope_kv(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const int64_t *positions,
                      const float *cs, const int64_t *slots, void *kc, void *vc, uint16_t *ksc, uint16_t *vsc,
                      int kv_formats, const float *kshift, int nthreads);
int ridgeline_paged_attention(const float *q, const void *kc, const void *vc, const uint16_t *ksc, const uint16_t *vsc,
                              const float *k0off, int kv_formats, const int64_t *tables, const int64_t *row_seq, const int64_t *key_lens,
                              const int64_t *tile_len, float *out, int64_t B, int64_t H, int64_t Hkv, int64_t D, int64_t bs, int64_t max_nb,
                              int64_t window, float scale, float softcap, const float *sinks, int nthreads);
int ridgeline_stack_linear(const int64_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt);
int ridgeline_lora_add(const int64_t *table, const int64_t *slot_of, const float *x, float *y, int64_t T, int64_t N,
                       int64_t K, int nt);

enum { LW_FORMAT, LW_DATA, LW_SCALE, LW_BIAS, LW_FIELDS };
enum { LIN_QKV, LIN_O, LIN_GATE_UP, LIN_DOWN, LINEARS };
enum { LP_IN_NORM, LP_POST_NORM, LP_WINDOW, LP_KV_FORMAT, LP_K_CACHE, LP_V_CACHE, LP_K_SCALE, LP_V_SCALE, LP_Q_NORM,
       LP_K_NORM, LP_MOE, LP_K_CENTERS, LP_ATTN_OUT_NORM, LP_MLP_OUT_NORM, LP_ACT, LP_COS_SIN, LP_SOFTCAP, LP_SINKS,
       LP_ACT_PARAMS, LP_KV_GROUP, LP_LINEAR,
       LP_FIELDS = LP_LINEAR + LINEARS * LW_FIELDS };
enum { GP_ROW0, GP_ROWS, GP_TABLES, GP_MAX_NB, GP_ROW_SEQ, GP_KEY_LENS, GP_TILE_LEN, GP_FIELDS };
enum { HOOK_ATTN_OUT, HOOK_MLP_OUT };
enum { ACT_SILU, ACT_GELU_TANH, ACT_SWIGLU_CLAMP };

typedef int (*stack_hook)(int64_t layer, int64_t where, float *x, int64_t T, int64_t H);
typedef int (*moe_route_fn)(int64_t layer, const float *probs, int64_t T, int64_t E, int64_t k, int64_t *idx);
int ridgeline_qk_norm(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const float *qw, const float *kw,
                      float eps, int nthreads);
int ridgeline_moe(const int64_t *desc, const float *x, float *out, int64_t T, int64_t H, float *buf,
                  moe_route_fn route, int64_t layer, int nt);

/* the layout, for the Python side to check against its own: 0 layer fields, 1 group fields,
 * 2 weight descriptor fields, 3 offset of the first weight descriptor in a layer */
int ridgeline_stack_fields(int which) {
    const int fields[] = {LP_FIELDS, GP_FIELDS, LW_FIELDS, LP_LINEAR};
    return which >= 0 && which < 4 ? fields[which] : -1;
}

/* format: K format | V format << 8 (kv_quant.h) */
int ridgeline_stack_kv_format(int64_t format) { return kv_known((int)(format & 0xff)) && kv_known((int)(format >> 8)); }

#define PTR(T, v) ((T *)(intptr_t)(v))

/* Phase clock, off unless RIDGELINE_STACK_PROFILE=1 at the first stack call: the wall seconds and the
 * calling thread's CPU seconds of each phase of every layer (a phase's parallel regions included, so its
 * threads' imbalance and barrier waits too), summed over calls until ridgeline_stack_profile reads and
 * clears them. Off, it costs one branch a phase. */
enum { PH_NORM, PH_QKV, PH_ROPE, PH_ATTN, PH_O, PH_GATE_UP, PH_ACT, PH_DOWN, PH_HOOK, PHASES };
static double ph_sum[2][PHASES];
static int64_t ph_calls;
static int ph_on = -1;

static double ph_clock(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
/* adds the wall and CPU time since t0 to phase p and restarts t0 */
static inline void ph_lap(int p, double *t0) {
    if (ph_on <= 0) return;
    const double w = ph_clock(CLOCK_MONOTONIC), c = ph_clock(CLOCK_THREAD_CPUTIME_ID);
    ph_sum[0][p] += w - t0[0];
    ph_sum[1][p] += c - t0[1];
    t0[0] = w, t0[1] = c;
}

/* out [2 * PHASES + 1]: wall seconds per phase (norms, qkv, rotary + KV write, attention, o, gate_up,
 * SiLU*up, down, hook), then the calling thread's CPU seconds per phase, then the number of stack calls;
 * clears them. Returns PHASES, or 0 when the clock is off. */
int ridgeline_stack_profile(double *out) {
    if (ph_on <= 0) return 0;
    for (int w = 0; w < 2; w++)
        for (int p = 0; p < PHASES; p++) out[w * PHASES + p] = ph_sum[w][p], ph_sum[w][p] = 0.0;
    out[2 * PHASES] = (double)ph_calls;
    ph_calls = 0;
    return PHASES;
}

/* floats of scratch a step of T tokens needs */
int64_t ridgeline_stack_scratch(const int64_t *dims, int64_t T) {
    const int64_t Hd = dims[1], H = dims[2], Hkv = dims[3], D = dims[4], I = dims[5];
    return T * (2 * Hd + (H + 2 * Hkv) * D + 2 * H * D + 3 * I);
}

/* x [T, hidden]: the residual stream, in and out (the embeddings when the run starts at layer 0 with
 * hidden_in = 0). out [T, hidden]: on entry, with hidden_in, the previous stage's last MLP output;
 * on exit the final norm of the last hidden state (final_norm given) or the last MLP output, with x
 * the residual it has not been added to yet: (hidden, residual) for the next stage.
 * buf: ridgeline_stack_scratch(dims, T) floats, kept by the caller (large steps would otherwise map
 * and fault in fresh pages every call); moe_buf: ridgeline_moe_scratch floats where a layer is
 * sparse. Returns 0, or non-zero from a kernel or the hook. */
int ridgeline_decoder_stack(const int64_t *dims, float eps, float scale, const int64_t *layers, int64_t first,
                            int64_t last, const float *cos_sin, const float *final_norm, float *x, float *out,
                            int hidden_in, int64_t T, const int64_t *positions, const int64_t *slots,
                            const int64_t *groups, int64_t ngroups, const int64_t *capture, stack_hook hook,
                            float *buf, float *moe_buf, moe_route_fn route, const int64_t *lora, int nt) {
    const int64_t Hd = dims[1], H = dims[2], Hkv = dims[3], D = dims[4], I = dims[5], bs = dims[6];
    const int64_t QKV = (H + 2 * Hkv) * D, HD = H * D;
    float *h = buf, *h2 = h + T * Hd, *qkv = h2 + T * Hd, *q = qkv + T * QKV, *att = q + T * HD, *gu = att + T * HD;
    float *act = gu + T * 2 * I;
    float *mlp = out; /* each layer's MLP output, consumed by the next norm before out is written */
    int have_hidden = hidden_in, rc = 0;
    if (ph_on < 0) {
        const char *e = getenv("RIDGELINE_STACK_PROFILE");
        ph_on = e && e[0] == '1';
    }
    const int64_t *lora_slot = lora ? PTR(const int64_t, lora[0]) : NULL, *lora_tab = lora ? PTR(const int64_t, lora[1]) : NULL;
/* linear i of layer l, then its LoRA additions where the layer's table has some */
#define LINEAR(i, in, y, N, K) \
    do { \
        rc |= ridgeline_stack_linear(lw + (i) * LW_FIELDS, in, y, T, N, K, nt); \
        if (lora_tab && lora_tab[l * LINEARS + (i)] && !rc) \
            rc |= ridgeline_lora_add(PTR(const int64_t, lora_tab[l * LINEARS + (i)]), lora_slot, in, y, T, N, K, nt); \
    } while (0)
    double t0[2] = {ph_on ? ph_clock(CLOCK_MONOTONIC) : 0.0, ph_on ? ph_clock(CLOCK_THREAD_CPUTIME_ID) : 0.0};
    ph_calls++;
    for (int64_t l = first; l < last && !rc; l++) {
        const int64_t *lp = layers + l * LP_FIELDS, *lw = lp + LP_LINEAR;
        if (have_hidden)
            ridgeline_rmsnorm(mlp, x, PTR(const float, lp[LP_IN_NORM]), h, T, Hd, eps, nt);
        else
            ridgeline_rmsnorm(x, NULL, PTR(const float, lp[LP_IN_NORM]), h, T, Hd, eps, nt);
        ph_lap(PH_NORM, t0);
        LINEAR(LIN_QKV, h, qkv, QKV, Hd);
        ph_lap(PH_QKV, t0);
        void *kc = PTR(void, lp[LP_K_CACHE]), *vc = PTR(void, lp[LP_V_CACHE]);
        uint16_t *ksc = PTR(uint16_t, lp[LP_K_SCALE]), *vsc = PTR(uint16_t, lp[LP_V_SCALE]);
        const int kvf = (int)lp[LP_KV_FORMAT];
        if (lp[LP_Q_NORM])
            ridgeline_qk_norm(qkv, T, H, Hkv, D, PTR(const float, lp[LP_Q_NORM]), PTR(const float, lp[LP_K_NORM]), eps,
                              nt);
        ph_lap(PH_NORM, t0);
        const float *kcenters = PTR(const float, lp[LP_K_CENTERS]), *k0off = kcenters ? kcenters + 2 * Hkv * D : NULL;
        const float *cs = lp[LP_COS_SIN] ? PTR(const float, lp[LP_COS_SIN]) : cos_sin;
        /* the layer's KV group: its slots and its block tables (KV groups, kv_groups.py) */
        const int64_t *lslots = slots + lp[LP_KV_GROUP] * T, *lgroups = groups + lp[LP_KV_GROUP] * ngroups * GP_FIELDS;
        rc |= ridgeline_rope_kv(qkv, T, H, Hkv, D, positions, cs, lslots, kc, vc, ksc, vsc, kvf, kcenters, nt);
        for (int64_t t = 0; t < T; t++) memcpy(q + t * HD, qkv + t * QKV, sizeof(float) * (size_t)HD);
        ph_lap(PH_ROPE, t0);
        const float softcap = lp[LP_SOFTCAP] ? *PTR(const float, lp[LP_SOFTCAP]) : 0.f;
        for (int64_t g = 0; g < ngroups && !rc; g++) {
            const int64_t *gp = lgroups + g * GP_FIELDS, r0 = gp[GP_ROW0];
            rc |= ridgeline_paged_attention(q + r0 * HD, kc, vc, ksc, vsc, k0off, kvf, PTR(const int64_t, gp[GP_TABLES]),
                                            PTR(const int64_t, gp[GP_ROW_SEQ]), PTR(const int64_t, gp[GP_KEY_LENS]),
                                            PTR(const int64_t, gp[GP_TILE_LEN]), att + r0 * HD, gp[GP_ROWS], H, Hkv, D, bs, gp[GP_MAX_NB],
                                            lp[LP_WINDOW], scale, softcap, PTR(const float, lp[LP_SINKS]), nt);
        }
        ph_lap(PH_ATTN, t0);
        LINEAR(LIN_O, att, h, Hd, HD);
        ph_lap(PH_O, t0);
        if (hook && !rc) rc = hook(l, HOOK_ATTN_OUT, h, T, Hd);
        ph_lap(PH_HOOK, t0);
        if (lp[LP_ATTN_OUT_NORM]) ridgeline_rmsnorm(h, NULL, PTR(const float, lp[LP_ATTN_OUT_NORM]), h, T, Hd, eps, nt);
        ridgeline_rmsnorm(h, x, PTR(const float, lp[LP_POST_NORM]), h2, T, Hd, eps, nt);
        ph_lap(PH_NORM, t0);
        if (lp[LP_MOE]) {
            rc |= ridgeline_moe(PTR(const int64_t, lp[LP_MOE]), h2, mlp, T, Hd, moe_buf, route, l, nt);
            ph_lap(PH_DOWN, t0); /* the sparse MLP counts as down */
        } else {
            LINEAR(LIN_GATE_UP, h2, gu, 2 * I, Hd);
            ph_lap(PH_GATE_UP, t0);
            if (lp[LP_ACT] == ACT_GELU_TANH)
                ridgeline_gelu_tanh_mul(gu, act, T, I, nt);
            else if (lp[LP_ACT] == ACT_SWIGLU_CLAMP) {
                const float *ap = PTR(const float, lp[LP_ACT_PARAMS]);
                ridgeline_swiglu_clamp_mul(gu, act, T, I, ap[0], ap[1], nt);
            }
            else
                ridgeline_silu_mul(gu, act, T, I, nt);
            ph_lap(PH_ACT, t0);
            LINEAR(LIN_DOWN, act, mlp, Hd, I);
            ph_lap(PH_DOWN, t0);
        }
        if (hook && !rc) rc = hook(l, HOOK_MLP_OUT, mlp, T, Hd);
        if (lp[LP_MLP_OUT_NORM]) ridgeline_rmsnorm(mlp, NULL, PTR(const float, lp[LP_MLP_OUT_NORM]), mlp, T, Hd, eps, nt);
        have_hidden = 1;
        if (capture && capture[l]) {
            float *cap = PTR(float, capture[l]);
            for (int64_t i = 0; i < T * Hd; i++) cap[i] = x[i] + mlp[i];
        }
        ph_lap(PH_HOOK, t0);
    }
    if (!rc && final_norm) {
        if (have_hidden)
            ridgeline_rmsnorm(mlp, x, final_norm, h, T, Hd, eps, nt);
        else
            ridgeline_rmsnorm(x, NULL, final_norm, h, T, Hd, eps, nt);
        memcpy(out, h, sizeof(float) * (size_t)(T * Hd));
    }
    ph_lap(PH_NORM, t0);
    return rc;
#undef LINEAR
}
