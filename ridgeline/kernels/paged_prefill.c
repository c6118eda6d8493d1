/* Tiled prefill attention on the paged cache (FlashAttention's recurrence on a CPU).
 *
 * The rows of prefill chunks come as query rows, each with its sequence (row_seq) and its causal key
 * count (key_lens = position + 1). Consecutive rows of one sequence at consecutive positions form a
 * run; a run is cut into query blocks of up to RP_MAX / G positions, and a task is one (query block,
 * KV head): its rows are the block's positions x that KV head's G query heads, so each K/V tile is
 * loaded once for all of them. A task walks the key tiles [KT j, KT (j + 1)) its rows can see (tiles
 * wholly outside every row's causal or sliding window are never touched), with the online softmax
 * (running max m, sum l, output O rescaled by exp(m_old - m_new)). Tasks are spread over threads
 * (dynamic, longest first). Scores and values: vdpbf16ps on a bf16 cache (q and p rounded to bf16),
 * fp32 FMA on every other format, each K/V tile dequantized once per task (paged_prefill_tile.h).
 *
 * ridgeline_paged_attention is the entry the layers call: tiled for prompt rows where it applies,
 * the per-row kernel (paged_attention.c) for decode rows, rows past the prompt and everything else. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "kv_quant.h"
#include "paged_src.h"

int ridgeline_paged_decode(const float *q, const void *kc, const void *vc, const uint16_t *ksc, const uint16_t *vsc,
                           const float *k0off, int kv_formats, const int64_t *tables, const int64_t *row_seq,
                           const int64_t *key_lens, float *out, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                           int64_t bs, int64_t max_nb, int64_t window, float scale, float softcap, const float *sinks,
                           int nthreads);

#ifdef __AVX512F__
#include "paged_attention_tile.h"
#include "paged_prefill_tile.h"

typedef struct {
    int64_t row0, npos, hk; /* rows [row0, row0 + npos) of one sequence, KV head hk */
} pf_task;

/* per-thread scratch, 64-byte aligned regions */
typedef struct {
    void *qt;          /* Q^T: [D/2][RP] u32 pairs or [D][RP] f32 */
    float *st;         /* S^T then P^T [KT][RP] */
    uint32_t *pp;      /* P pairs [KT/2][RP] */
    float *kf, *vf;    /* dequantized K, V rows [KT][D]; vf also holds V pairs [KT/2][D] */
    float *o;          /* O [RP][D] */
    float *m, *l, *alpha, *qrow;
    int32_t *first, *len;
} pf_buf;

static void *pf_alloc(pf_buf *b, int64_t D) {
    const int64_t RP = RP_MAX, sizes[] = {D * RP, KT * RP, KT / 2 * RP, KT * D, KT * D, RP * D, RP, RP, RP, D, RP, RP};
    enum { N = sizeof sizes / sizeof sizes[0] };
    int64_t total = 0;
    for (int i = 0; i < N; i++) total += (sizes[i] + 15) & ~(int64_t)15;
    char *mem = aligned_alloc(64, (size_t)total * 4);
    if (!mem) return NULL;
    void **dst[] = {&b->qt, (void **)&b->st, (void **)&b->pp, (void **)&b->kf, (void **)&b->vf, (void **)&b->o,
                    (void **)&b->m, (void **)&b->l, (void **)&b->alpha, (void **)&b->qrow, (void **)&b->first,
                    (void **)&b->len};
    for (int i = 0, off = 0; i < N; off += (int)((sizes[i] + 15) & ~(int64_t)15), i++) *dst[i] = mem + 4 * off;
    return mem;
}

static const float zero_row[ATT_MAX_D];

/* key pos's vector of head hk (the zero row outside [lo, hi)) */
static inline const void *key_vec(const att_src *s, int w, const int64_t *table, int64_t pos, int64_t lo, int64_t hi,
                                  int64_t hk) {
    if (pos < lo || pos >= hi) return zero_row;
    return vec_ptr(s, w, table[pos / s->bs] * s->bs + pos % s->bs, hk);
}

/* dequantized rows [KT][D] of the tile at t0 (zeros outside [lo, hi)) */
static void deq_tile(const att_src *s, int w, const int64_t *table, int64_t t0, int64_t lo, int64_t hi, int64_t hk,
                     float *dst) {
    for (int k = 0; k < KT; k++) {
        const int64_t pos = t0 + k;
        if (pos < lo || pos >= hi)
            memset(dst + k * s->D, 0, sizeof(float) * (size_t)s->D);
        else
            deq_chunk(s, w, table[pos / s->bs] * s->bs + pos % s->bs, 1, hk, dst + k * s->D);
    }
}

/* key 0 of a centered K into each row's (m, l, O): its own score, once per row (paged_src.h k0off) */
static void add_key0(const att_src *s, const float *q, const pf_task *t, const int64_t *table, int64_t window,
                     int64_t H, pf_buf *b, int64_t rows) {
    const int64_t D = s->D, G = s->G;
    float *k0 = b->kf, *v0 = b->kf + D; /* the K tile's scratch: free after the last tile */
    load_key0(s, table, t->hk, k0, v0);
    for (int64_t r = 0; r < rows; r++) {
        if (first_key(b->len[r], window) > 0) continue; /* key 0 outside this row's window */
        memcpy(b->qrow, q + ((t->row0 + r / G) * H + t->hk * G + r % G) * D, sizeof(float) * (size_t)D);
        if (kv_rotated(s->fmt[0])) kv_fwht(b->qrow, D);
        float acc = 0.f;
        for (int64_t d = 0; d < D; d++) acc += b->qrow[d] * k0[d];
        add_key(b->m + r, b->l + r, b->o + r * D, soft_capped(acc * s->scale_qk, s->softcap), v0, D, b->l[r] == 0.f);
    }
}

/* One task: rows r = p * G + g (position row0 + p, query head hk * G + g) in the lanes of RV vectors. */
static inline __attribute__((always_inline)) void run_task(const att_src *s, int bf16, const float *q, const pf_task *t,
                                                          const int64_t *table, const int64_t *key_lens,
                                                          int64_t window, int64_t H, float *out, pf_buf *b,
                                                          const int RV, const int NE) {
    const int64_t D = s->D, G = s->G, RP = 16 * RV, rows = t->npos * G, rows4 = (rows + 3) & ~(int64_t)3, hk = t->hk;
    for (int64_t r = 0; r < RP; r++) {
        const int64_t p = r / G, len = r < rows ? key_lens[t->row0 + p] : 0;
        const int64_t first = first_key(len, window);
        b->len[r] = (int32_t)len, b->first[r] = (int32_t)(first == 0 && s->k0off ? 1 : first); /* key 0: below */
        b->m[r] = -FLT_MAX, b->l[r] = 0.f;
        const float *qr = zero_row;
        if (r < rows) {
            qr = q + ((t->row0 + p) * H + hk * G + r % G) * D;
            if (kv_rotated(s->fmt[0])) { /* (Hq).(Hk) = q.k */
                memcpy(b->qrow, qr, sizeof(float) * (size_t)D);
                kv_fwht(b->qrow, D);
                qr = b->qrow;
            }
        }
        if (bf16)
            for (int64_t i = 0; i < D / 2; i++)
                ((uint32_t *)b->qt)[i * RP + r] = kv_f32_to_bf16(qr[2 * i]) | (uint32_t)kv_f32_to_bf16(qr[2 * i + 1]) << 16;
        else
            for (int64_t d = 0; d < D; d++) ((float *)b->qt)[d * RP + r] = qr[d];
    }
    memset(b->o, 0, sizeof(float) * (size_t)(rows4 * D));
    const int64_t lo = first_key(key_lens[t->row0], window), hi = key_lens[t->row0 + t->npos - 1];
    for (int64_t t0 = lo / KT * KT; t0 < hi; t0 += KT) {
#ifdef __AVX512BF16__
        if (bf16) {
            const uint16_t *kp[KT], *vp[KT];
            for (int k = 0; k < KT; k++)
                kp[k] = key_vec(s, 0, table, t0 + k, lo, hi, hk), vp[k] = key_vec(s, 1, table, t0 + k, lo, hi, hk);
            PF_BY_RV(qk_bf16, RV, b->qt, kp, b->st, D, s->scale_qk);
            soft_cap_all(b->st, KT * RP, s->softcap);
            PF_BY_RV(softmax_tile, RV, b->st, b->first, b->len, t0, b->m, b->l, b->alpha);
            pack_p_bf16(b->st, b->pp, RP);
            pack_v_bf16(vp, (uint32_t *)b->vf, D);
            PF_BY_NE(pv_bf16, NE, b->pp, (const uint32_t *)b->vf, b->alpha, b->o, rows4, D, RP);
            continue;
        }
#endif
        deq_tile(s, 0, table, t0, lo, hi, hk, b->kf);
        PF_BY_RV(qk_f32, RV, b->qt, b->kf, b->st, D, s->scale_qk);
        soft_cap_all(b->st, KT * RP, s->softcap);
        PF_BY_RV(softmax_tile, RV, b->st, b->first, b->len, t0, b->m, b->l, b->alpha);
        deq_tile(s, 1, table, t0, lo, hi, hk, b->vf);
        PF_BY_NE(pv_f32, NE, b->st, b->vf, b->alpha, b->o, rows4, D, RP);
    }
    if (s->k0off) add_key0(s, q, t, table, window, H, b, rows);
    for (int64_t r = 0; r < rows; r++) { /* out = O / l, rotated back for a rotated V (H is its own inverse) */
        float *dst = out + ((t->row0 + r / G) * H + hk * G + r % G) * D;
        const float inv = 1.f / denominator(b->l[r], b->m[r], s->sinks, hk * G + r % G);
        for (int64_t d = 0; d < D; d++) dst[d] = b->o[r * D + d] * inv;
        if (kv_rotated(s->fmt[1])) kv_fwht(dst, D);
    }
}

static void task(const att_src *s, int bf16, const float *q, const pf_task *t, const int64_t *table,
                 const int64_t *key_lens, int64_t window, int64_t H, float *out, pf_buf *b) {
    const int rv = (int)((t->npos * s->G + 15) / 16), ne = s->D % 64 == 0 ? 4 : s->D % 32 == 0 ? 2 : 1;
#define RUN(RV, NE) run_task(s, bf16, q, t, table, key_lens, window, H, out, b, RV, NE)
#define BY_NE(RV) (ne == 4 ? RUN(RV, 4) : ne == 2 ? RUN(RV, 2) : RUN(RV, 1))
    if (rv == 1) BY_NE(1);
    else if (rv == 2) BY_NE(2);
    else BY_NE(3);
#undef BY_NE
#undef RUN
}

static inline int tiled_row(const int64_t *row_seq, const int64_t *key_lens, const int64_t *tile_len, int64_t r) {
    return !tile_len || key_lens[r] <= tile_len[row_seq[r]];
}

/* tiled rows -> tasks: runs of one sequence at consecutive positions, cut every qb positions, x KV heads */
static int64_t make_tasks(const int64_t *row_seq, const int64_t *key_lens, const int64_t *tile_len, int64_t B,
                          int64_t Hkv, int64_t qb, pf_task *tasks) {
    int64_t n = 0;
    for (int64_t r = 0, e; r < B; r = e) {
        e = r + 1;
        if (!tiled_row(row_seq, key_lens, tile_len, r)) continue;
        while (e < B && e - r < qb && row_seq[e] == row_seq[e - 1] && key_lens[e] == key_lens[e - 1] + 1 &&
               tiled_row(row_seq, key_lens, tile_len, e))
            e++;
        for (int64_t hk = 0; hk < Hkv; hk++) tasks[n++] = (pf_task){r, e - r, hk};
    }
    return n;
}

/* 1 if the tiled kernel serves this call */
static int tiled_applies(int kf, int vf, int64_t D, int64_t G, const int64_t *row_seq) {
    return row_seq && kv_known(kf) && kv_known(vf) && D % 16 == 0 && D <= ATT_MAX_D && G <= RP_MAX;
}

static int paged_prefill(const float *q, const att_src *src, const int64_t *tables, const int64_t *row_seq,
                         const int64_t *key_lens, const int64_t *tile_len, float *out, int64_t B, int64_t H,
                         int64_t max_nb, int64_t window, int nthreads) {
    int bf16 = 0;
#ifdef __AVX512BF16__
    bf16 = src->fmt[0] == KV_BF16 && src->fmt[1] == KV_BF16;
#endif
    pf_task *tasks = malloc(sizeof(pf_task) * (size_t)(B * src->Hkv));
    if (!tasks) return -1;
    const int64_t n = make_tasks(row_seq, key_lens, tile_len, B, src->Hkv, RP_MAX / src->G, tasks);
    int failed = 0;
    if (!n) { /* no prompt row (a verification's rows only): no team, no buffers */
        free(tasks);
        return 0;
    }
    #pragma omp parallel num_threads(nthreads)
    {
        pf_buf buf;
        void *mem = pf_alloc(&buf, src->D);
        if (!mem) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) { /* last tasks first: later positions see more keys */
            const pf_task *t = tasks + n - 1 - i;
            if (mem) task(src, bf16, q, t, tables + row_seq[t->row0] * max_nb, key_lens, window, H, out, &buf);
        }
        free(mem);
    }
    free(tasks);
    return failed ? -1 : 0;
}
#endif

/* Same contract as ridgeline_paged_decode (paged_attention.c), plus tile_len [S] (or NULL: every
 * row): rows given with row_seq whose key_lens <= tile_len[row_seq] (prompt rows) go through the
 * tiled kernel where this build has it; the other rows (outputs being verified or recomputed) through
 * the per-row kernel, which gives them what the decode step computes, bit for bit. */
int ridgeline_paged_attention(const float *q, const void *kc, const void *vc, const uint16_t *ksc, const uint16_t *vsc,
                              const float *k0off, int kv_formats, const int64_t *tables, const int64_t *row_seq,
                              const int64_t *key_lens, const int64_t *tile_len, float *out, int64_t B, int64_t H,
                              int64_t Hkv, int64_t D, int64_t bs, int64_t max_nb, int64_t window, float scale,
                              float softcap, const float *sinks, int nthreads) {
#ifdef __AVX512F__
    const int kf = kv_formats & 0xff, vf = kv_formats >> 8;
    if (tiled_applies(kf, vf, D, H / Hkv, row_seq)) {
        const att_src src = {{kc, vc}, {ksc, vsc}, {kf, vf}, {kv_vec_bytes(kf, D), kv_vec_bytes(vf, D)},
                             {kv_vec_scales(kf, D), kv_vec_scales(vf, D)}, Hkv, D, H / Hkv, bs, scale, k0off, softcap,
                             sinks};
        int rc = paged_prefill(q, &src, tables, row_seq, key_lens, tile_len, out, B, H, max_nb, window, nthreads);
        for (int64_t r = 0, e; r < B && !rc; r = e) { /* runs of untiled rows */
            for (e = r; e < B && !tiled_row(row_seq, key_lens, tile_len, e);) e++;
            if (e > r)
                rc = ridgeline_paged_decode(q + r * H * D, kc, vc, ksc, vsc, k0off, kv_formats, tables, row_seq + r,
                                            key_lens + r, out + r * H * D, e - r, H, Hkv, D, bs, max_nb, window,
                                            scale, softcap, sinks, nthreads);
            else
                e++;
        }
        return rc;
    }
#endif
    return ridgeline_paged_decode(q, kc, vc, ksc, vsc, k0off, kv_formats, tables, row_seq, key_lens, out, B, H, Hkv, D, bs,
                                  max_nb, window, scale, softcap, sinks, nthreads);
}
