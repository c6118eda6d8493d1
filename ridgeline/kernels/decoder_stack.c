/* The whole decoder stack of a Llama-family model for one step, in one call from Python: for every
 * layer RMSNorm (+ residual) -> qkv matmul (+ bias) -> rotary + KV write -> paged attention ->
 * o matmul (+ bias) -> RMSNorm + residual -> gate_up matmul -> SiLU * up -> down matmul, then the
 * final norm. It calls the same kernels, in the same order and on the same data, as the Python
 * modules do one op at a time (models/llama.py), so the results are bitwise identical; what it
 * saves is the interpreter and dispatch cost between them (~10 calls per layer).
 *
 * dims:   [layers, hidden, heads, kv_heads, head_dim, intermediate, block_size, window, weights_bf16, kv_bf16]
 * layers: [layers][LP_FIELDS] pointers (as int64), see the enum; biases may be 0
 * groups: [ngroups][GP_FIELDS]: attention groups over the flattened rows, as the runner builds them */
#include <stdint.h>
#include <string.h>

int ridgeline_rmsnorm(const float *x, float *residual, const float *w, float *out, int64_t T, int64_t H, float eps,
                      int nthreads);
int ridgeline_silu_mul(const float *gu, float *out, int64_t T, int64_t I, int nthreads);
int ridgeline_rope_kv(float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const int64_t *positions,
                      const float *cs, const int64_t *slots, void *kc, void *vc, int kv_bf16, int nthreads);
int ridgeline_paged_decode(const float *q, const void *kc, const void *vc, int kv_bf16, const int64_t *tables,
                           const int64_t *row_seq, const int64_t *key_lens, float *out, int64_t B, int64_t H,
                           int64_t Hkv, int64_t D, int64_t bs, int64_t max_nb, int64_t window, float scale,
                           int nthreads);
int ridgeline_gemm_f32p(const float *p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads);
int ridgeline_gemm_bf16p(const uint16_t *p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nthreads);

enum { LP_IN_NORM, LP_QKV, LP_QKV_BIAS, LP_O, LP_O_BIAS, LP_POST_NORM, LP_GATE_UP, LP_DOWN, LP_K_CACHE, LP_V_CACHE,
       LP_FIELDS };
enum { GP_ROW0, GP_ROWS, GP_TABLES, GP_MAX_NB, GP_ROW_SEQ, GP_KEY_LENS, GP_FIELDS };

int ridgeline_stack_fields(int which) { return which ? GP_FIELDS : LP_FIELDS; }

static int gemm(int bf16, int64_t p, const float *x, float *y, int64_t M, int64_t N, int64_t K, int nt) {
    return bf16 ? ridgeline_gemm_bf16p((const uint16_t *)(intptr_t)p, x, y, M, N, K, nt)
                : ridgeline_gemm_f32p((const float *)(intptr_t)p, x, y, M, N, K, nt);
}

static void add_bias(float *y, int64_t bias, int64_t T, int64_t N) {
    if (!bias) return;
    const float *b = (const float *)(intptr_t)bias;
    for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < N; n++) y[t * N + n] += b[n];
}

#define PTR(T, v) ((T *)(intptr_t)(v))

/* floats of scratch a step of T tokens needs */
int64_t ridgeline_stack_scratch(const int64_t *dims, int64_t T) {
    const int64_t Hd = dims[1], H = dims[2], Hkv = dims[3], D = dims[4], I = dims[5];
    return T * (2 * Hd + (H + 2 * Hkv) * D + 2 * H * D + 3 * I);
}

/* x [T, hidden]: the embeddings in, the residual stream afterwards; out [T, hidden]: the final norm;
 * buf: ridgeline_stack_scratch(dims, T) floats, kept by the caller (large steps would otherwise map
 * and fault in fresh pages every call) */
int ridgeline_decoder_stack(const int64_t *dims, float eps, float scale, const int64_t *layers, const float *cos_sin,
                            const float *final_norm, float *x, float *out, int64_t T, const int64_t *positions,
                            const int64_t *slots, const int64_t *groups, int64_t ngroups, float *buf, int nt) {
    const int64_t L = dims[0], Hd = dims[1], H = dims[2], Hkv = dims[3], D = dims[4], I = dims[5], bs = dims[6];
    const int64_t window = dims[7];
    const int wbf16 = (int)dims[8], kvbf16 = (int)dims[9];
    const int64_t QKV = (H + 2 * Hkv) * D, HD = H * D;
    float *h = buf, *h2 = h + T * Hd, *qkv = h2 + T * Hd, *q = qkv + T * QKV, *att = q + T * HD, *gu = att + T * HD;
    float *act = gu + T * 2 * I;
    float *mlp = out; /* each layer's MLP output, consumed by the next norm before out is written */
    int rc = 0;
    for (int64_t l = 0; l < L && !rc; l++) {
        const int64_t *lp = layers + l * LP_FIELDS;
        if (l == 0)
            ridgeline_rmsnorm(x, NULL, PTR(const float, lp[LP_IN_NORM]), h, T, Hd, eps, nt);
        else
            ridgeline_rmsnorm(mlp, x, PTR(const float, lp[LP_IN_NORM]), h, T, Hd, eps, nt);
        rc |= gemm(wbf16, lp[LP_QKV], h, qkv, T, QKV, Hd, nt);
        add_bias(qkv, lp[LP_QKV_BIAS], T, QKV);
        void *kc = PTR(void, lp[LP_K_CACHE]), *vc = PTR(void, lp[LP_V_CACHE]);
        ridgeline_rope_kv(qkv, T, H, Hkv, D, positions, cos_sin, slots, kc, vc, kvbf16, nt);
        for (int64_t t = 0; t < T; t++) memcpy(q + t * HD, qkv + t * QKV, sizeof(float) * (size_t)HD);
        for (int64_t g = 0; g < ngroups && !rc; g++) {
            const int64_t *gp = groups + g * GP_FIELDS, r0 = gp[GP_ROW0];
            rc |= ridgeline_paged_decode(q + r0 * HD, kc, vc, kvbf16, PTR(const int64_t, gp[GP_TABLES]),
                                         PTR(const int64_t, gp[GP_ROW_SEQ]), PTR(const int64_t, gp[GP_KEY_LENS]),
                                         att + r0 * HD, gp[GP_ROWS], H, Hkv, D, bs, gp[GP_MAX_NB], window, scale, nt);
        }
        rc |= gemm(wbf16, lp[LP_O], att, h, T, Hd, HD, nt);
        add_bias(h, lp[LP_O_BIAS], T, Hd);
        ridgeline_rmsnorm(h, x, PTR(const float, lp[LP_POST_NORM]), h2, T, Hd, eps, nt);
        rc |= gemm(wbf16, lp[LP_GATE_UP], h2, gu, T, 2 * I, Hd, nt);
        ridgeline_silu_mul(gu, act, T, I, nt);
        rc |= gemm(wbf16, lp[LP_DOWN], act, mlp, T, Hd, I, nt);
    }
    if (!rc) {
        ridgeline_rmsnorm(mlp, x, final_norm, h, T, Hd, eps, nt);
        memcpy(out, h, sizeof(float) * (size_t)(T * Hd));
    }
    return rc;
}
