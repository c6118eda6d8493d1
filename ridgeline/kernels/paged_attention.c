/* Attention straight from the paged KV cache: query rows against their sequences' cached keys, no gather.
 * q [B, H, D] fp32; K and V caches in any KV format of kv_quant.h (data [NB, bs, Hkv, vector], fp16
 * scales [NB, bs, Hkv, scales per vector] for quantized ones), dequantized inside the kernel; scores,
 * softmax and the output in fp32; block_tables [S, max_nb], key_lens [B] -> out [B, H, D].
 *
 * Split-KV (flash-decoding): a row's keys are cut at fixed multiples of SPLIT positions; each split
 * yields a partial (max m, sum l of exp(s - m), u = sum exp(s - m) v), and the partials are merged in
 * split order by one function. The cut depends on the row's own length only, so a row's result is
 * the same whoever computes its splits: with few rows, every (row, split) is a task of its own (all
 * KV heads: a position's heads lie side by side, so a task streams whole rows of the block) and one
 * long sequence keeps every thread busy whatever its number of KV heads; with many rows, a task is a
 * row (all its heads and splits). A head's partial does not depend on which other heads share its
 * task, so both shapes give a row the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "kv_quant.h"

#define SPLIT 256 /* positions per split, a multiple of every block size up to it */

#include "paged_src.h"

/* Portable path, any format and head_dim: each vector dequantized (kv_load) before use. q: the task's
 * (h1 - h0) * G query rows, already rotated for a rotated K. Writes m, l [rows], u [rows, D]. */
static void attend_any(const att_src *s, const float *q, const att_range *r, float *scores, float *vec, float *m,
                       float *l, float *u) {
    const int64_t D = s->D, G = s->G, n = r->hi - r->lo, rows = (r->h1 - r->h0) * G;
    for (int64_t pos = r->lo; pos < r->hi; pos++) {
        const int64_t slot = r->table[pos / s->bs] * s->bs + pos % s->bs;
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            kv_load(s->fmt[0], vec_ptr(s, 0, slot, hk), scale_ptr(s, 0, slot, hk), vec, D);
            for (int64_t g = 0; g < G; g++) {
                const float *qg = q + ((hk - r->h0) * G + g) * D;
                float acc = 0.f;
                #pragma omp simd reduction(+ : acc)
                for (int64_t d = 0; d < D; d++) acc += qg[d] * vec[d];
                scores[((hk - r->h0) * G + g) * n + pos - r->lo] = acc * s->scale_qk;
            }
        }
    }
    soft_cap_all(scores, rows * n, s->softcap);
    for (int64_t i = 0; i < rows; i++) {
        float *sr = scores + i * n, mx = sr[0], sum = 0.f;
        for (int64_t j = 1; j < n; j++) mx = sr[j] > mx ? sr[j] : mx;
        for (int64_t j = 0; j < n; j++) {
            sr[j] = expf(sr[j] - mx);
            sum += sr[j];
        }
        m[i] = mx;
        l[i] = sum;
    }
    memset(u, 0, sizeof(float) * (size_t)(rows * D));
    for (int64_t pos = r->lo; pos < r->hi; pos++) {
        const int64_t slot = r->table[pos / s->bs] * s->bs + pos % s->bs;
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            kv_load(s->fmt[1], vec_ptr(s, 1, slot, hk), scale_ptr(s, 1, slot, hk), vec, D);
            for (int64_t g = 0; g < G; g++) {
                const int64_t i = (hk - r->h0) * G + g;
                const float p = scores[i * n + pos - r->lo];
                float *o = u + i * D;
                #pragma omp simd
                for (int64_t d = 0; d < D; d++) o[d] += p * vec[d];
            }
        }
    }
}

#ifdef __AVX512F__
#include "reduce16.h"
#include "vexp.h"
#include "paged_attention_tile.h"

#define FAST attend_f32_fast
#define KV_T float
#define QK_W 16
#define QV_T __m512
#define Q_PREP(dst, src) (*(dst) = _mm512_loadu_ps(src))
#define QK_STEP(acc, qv, kp) _mm512_fmadd_ps(qv, _mm512_loadu_ps(kp), acc)
#define V_LOAD(p, e) _mm512_loadu_ps((p) + 16 * (e))
#include "paged_attention_avx512.h"
#define TILE 1
#undef FAST
#define FAST attend_tile_fast
#include "paged_attention_avx512.h"
#undef FAST
/* int8 V: each 16 codes widened in registers, the position's scale folded into its weight (no tile) */
#define FAST attend_tile_i8v_fast
#define V_T int8_t
#define V_SCALED 1
#undef V_LOAD
#define V_LOAD(p, e) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((p) + 16 * (e)))))
#include "paged_attention_avx512.h"
#undef V_T
#undef V_SCALED
#undef TILE
#undef FAST
#undef KV_T
#undef QK_W
#undef QV_T
#undef Q_PREP
#undef QK_STEP
#undef V_LOAD
#define HAVE_FAST 1
#endif

#include "paged_attention_i8.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define FAST attend_bf16_fast
#define KV_T uint16_t
#define QK_W 32
#define QV_T __m512bh
#define Q_PREP(dst, src) (*(dst) = _mm512_cvtne2ps_pbh(_mm512_loadu_ps((src) + 16), _mm512_loadu_ps(src)))
static inline __m512bh load_pbh(const void *p) { /* a plain load: GCC 12 routes a cast from __m512i through the stack */
    __m512bh v;
    memcpy(&v, p, sizeof v);
    return v;
}
#define QK_STEP(acc, qv, kp) _mm512_dpbf16_ps(acc, qv, load_pbh(kp))
/* a 64-byte load of 32 bf16 gives two fp32 vectors with one instruction each: the even elements
 * shifted up, the odd ones masked; accumulators hold [even 16, odd 16] per 32 elements */
#define V_LOAD(p, e)                                                                                          \
    _mm512_castsi512_ps((e) % 2 ? _mm512_and_si512(_mm512_loadu_si512((p) + 32 * ((e) / 2)),                  \
                                                   _mm512_set1_epi32((int)0xFFFF0000u))                       \
                                : _mm512_slli_epi32(_mm512_loadu_si512((p) + 32 * ((e) / 2)), 16))
static inline void v_order_pairs(float *u, int64_t D) { /* [even 16, odd 16] -> 32 in order */
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int64_t k = 0; k < D; k += 32) {
        const __m512 ev = _mm512_loadu_ps(u + k), od = _mm512_loadu_ps(u + k + 16);
        _mm512_storeu_ps(u + k, _mm512_permutex2var_ps(ev, lo, od));
        _mm512_storeu_ps(u + k + 16, _mm512_permutex2var_ps(ev, hi, od));
    }
}
#define V_ORDER v_order_pairs
#include "paged_attention_avx512.h"
#define HAVE_BF16_FAST 1
#endif

enum { PATH_ANY, PATH_F32, PATH_BF16, PATH_TILE, PATH_TILE_I8V, PATH_I8 };

/* which implementation reads this pair of formats: decided by the formats and D alone */
static int choose_path(int kf, int vf, int64_t D) {
    (void)kf, (void)vf, (void)D;
#ifdef HAVE_BF16_FAST
    if (kf == KV_BF16 && vf == KV_BF16 && D % 32 == 0 && D <= ATT_MAX_D) return PATH_BF16;
#endif
#ifdef HAVE_I8_FAST
    if (kf == KV_I8 && vf == KV_I8 && D % 32 == 0 && D <= ATT_MAX_D) return PATH_I8;
#endif
#ifdef HAVE_FAST
    if (kf == KV_F32 && vf == KV_F32 && D % 16 == 0 && D <= ATT_MAX_D) return PATH_F32;
    if (vf == KV_I8 && D % 16 == 0 && D <= ATT_MAX_D) return PATH_TILE_I8V;
    if (D % 16 == 0 && D <= ATT_MAX_D) return PATH_TILE;
#endif
    return PATH_ANY;
}

/* how the decode kernel rounds q for the scores of this pair of formats: 0 none (fp32), 1 to bf16,
 * 2 to int16 with a power-of-two scale per query head (q16_prep) */
int ridgeline_paged_decode_q_rounding(int kv_formats, int64_t D) {
    const int path = choose_path(kv_formats & 0xff, kv_formats >> 8, D);
    return path == PATH_BF16 ? 1 : path == PATH_I8 ? 2 : 0;
}

/* per-thread buffers */
typedef struct {
    float *scores, *q, *vec, *m, *l, *u, *M, *L, *U;
    void *qbuf;
} att_buf;

static void *alloc_buf(att_buf *b, int64_t rows, int64_t D) {
    const size_t sc = (size_t)(rows * SPLIT), rd = (size_t)(rows * D);
    /* scores, q, vec/tile (16 x D), m, l, u, M, L, U, prepared q (+ 64 for alignment) */
    float *p = malloc(sizeof(float) * (sc + rd + 16 * (size_t)D + 4 * (size_t)rows + 3 * rd) + 128);
    if (!p) return NULL;
    b->scores = p;
    b->q = p + sc;
    b->vec = b->q + rd;
    b->m = b->vec + 16 * D;
    b->l = b->m + rows;
    b->M = b->l + rows;
    b->L = b->M + rows;
    b->u = b->L + rows;
    b->U = b->u + rd;
    b->qbuf = (void *)(((uintptr_t)(b->U + rd) + 63) & ~(uintptr_t)63);
    return p;
}

/* one split's partial for rows of heads [h0, h1) into m, l, u; q: the row's H * D query */
static void partial(const att_src *s, int path, const float *q, const att_range *r, att_buf *b) {
    const int64_t D = s->D, rows = (r->h1 - r->h0) * s->G;
    const float *qt = q + r->h0 * s->G * D;
    if (kv_rotated(s->fmt[0])) { /* (Hq).(Hk) = q.k */
        memcpy(b->q, qt, sizeof(float) * (size_t)(rows * D));
        for (int64_t i = 0; i < rows; i++) kv_fwht(b->q + i * D, D);
        qt = b->q;
    }
    const int key0 = s->k0off && r->lo == 0; /* position 0 in range, stored with its own center */
    att_range rest = *r;
    rest.lo += key0;
    if (rest.lo < rest.hi) switch (path) {
#ifdef HAVE_FAST
    case PATH_F32: attend_f32_fast(s, qt, &rest, b->scores, b->vec, b->qbuf, b->m, b->l, b->u); break;
    case PATH_TILE: attend_tile_fast(s, qt, &rest, b->scores, b->vec, b->qbuf, b->m, b->l, b->u); break;
    case PATH_TILE_I8V: attend_tile_i8v_fast(s, qt, &rest, b->scores, b->vec, b->qbuf, b->m, b->l, b->u); break;
#endif
#ifdef HAVE_I8_FAST
    case PATH_I8: attend_i8_fast(s, qt, &rest, b->scores, b->vec, b->qbuf, b->m, b->l, b->u); break;
#endif
#ifdef HAVE_BF16_FAST
    case PATH_BF16: attend_bf16_fast(s, qt, &rest, b->scores, b->vec, b->qbuf, b->m, b->l, b->u); break;
#endif
    default: attend_any(s, qt, &rest, b->scores, b->vec, b->m, b->l, b->u);
    }
    if (key0) /* once per (row, head) a step: no work per key */
        for (int64_t hk = r->h0; hk < r->h1; hk++) {
            load_key0(s, r->table, hk, b->vec, b->vec + D);
            for (int64_t g = 0; g < s->G; g++) {
                const int64_t i = (hk - r->h0) * s->G + g;
                float acc = 0.f;
                for (int64_t d = 0; d < D; d++) acc += qt[i * D + d] * b->vec[d];
                add_key(b->m + i, b->l + i, b->u + i * D, soft_capped(acc * s->scale_qk, s->softcap), b->vec + D, D,
                        rest.lo >= rest.hi);
            }
        }
}

/* Running state (M, L, U) of `rows` rows += partial (m, l, u), in split order; first: start from it.
 * Never inlined: both task shapes run these very instructions, so a row's result is bitwise the same. */
static __attribute__((noinline)) void merge(float *M, float *L, float *U, const float *m, const float *l,
                                            const float *u, int64_t rows, int64_t D, int first) {
    if (first) {
        memcpy(M, m, sizeof(float) * (size_t)rows);
        memcpy(L, l, sizeof(float) * (size_t)rows);
        memcpy(U, u, sizeof(float) * (size_t)(rows * D));
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        const float mx = m[i] > M[i] ? m[i] : M[i], a = expf(M[i] - mx), c = expf(m[i] - mx);
        L[i] = L[i] * a + l[i] * c;
        M[i] = mx;
        float *Ui = U + i * D;
        const float *ui = u + i * D;
        for (int64_t d = 0; d < D; d++) Ui[d] = Ui[d] * a + ui[d] * c;
    }
}

/* out rows = U / L (L with row i's sink added: sinks NULL or the rows' heads' sinks), rotated back for a
 * rotated V (H is its own inverse) */
static __attribute__((noinline)) void finish(const float *M, const float *L, const float *U, const float *sinks,
                                             float *out, int64_t rows, int64_t D, int rotated) {
    for (int64_t i = 0; i < rows; i++) {
        const float inv = 1.f / denominator(L[i], M[i], sinks, i);
        for (int64_t d = 0; d < D; d++) out[i * D + d] = U[i * D + d] * inv;
        if (rotated) kv_fwht(out + i * D, D);
    }
}

/* split sp of a row [first, len): positions [max(first, sp * SPLIT), min(len, (sp + 1) * SPLIT)) */
static inline void split_range(att_range *r, int64_t first, int64_t len, int64_t sp) {
    r->lo = sp * SPLIT > first ? sp * SPLIT : first;
    r->hi = (sp + 1) * SPLIT < len ? (sp + 1) * SPLIT : len;
}

/* B query rows. Row b attends to the first key_lens[b] positions (the last `window` of them when
 * window > 0) of the sequence whose block table is tables[row_seq ? row_seq[b] : b]: one decode token
 * per sequence, or (row_seq given) the rows of prefill chunks, each a query at its own position
 * (key_lens = position + 1: causal). kv_formats = K format | V format << 8. Returns 0, -1 if out of
 * memory, -2 for an unknown format. k0off: NULL, or [Hkv, D] added to the dequantized key at position 0
 * (paged_src.h). sinks: NULL, or [H] fp32 attention-sink logits (paged_src.h). */
int ridgeline_paged_decode(const float *q, const void *kc, const void *vc, const uint16_t *ksc, const uint16_t *vsc,
                           const float *k0off, int kv_formats, const int64_t *tables, const int64_t *row_seq,
                           const int64_t *key_lens, float *out, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                           int64_t bs, int64_t max_nb, int64_t window, float scale, float softcap, const float *sinks,
                           int nthreads) {
    const int kf = kv_formats & 0xff, vf = kv_formats >> 8;
    if (!kv_known(kf) || !kv_known(vf)) return -2;
    const att_src src = {{kc, vc}, {ksc, vsc}, {kf, vf}, {kv_vec_bytes(kf, D), kv_vec_bytes(vf, D)},
                         {kv_vec_scales(kf, D), kv_vec_scales(vf, D)}, Hkv, D, H / Hkv, bs, scale, k0off, softcap,
                         sinks};
    const int path = choose_path(kf, vf, D), vrot = kv_rotated(vf);
    const int64_t G = H / Hkv;
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; b++) max_len = key_lens[b] > max_len ? key_lens[b] : max_len;
    const int by_split = B < 2 * nthreads; /* else a task is a row */
    const int64_t nsplit = (max_len - 1) / SPLIT + 1, part = H * (D + 2); /* floats of one (row, split) partial */
    float *parts = by_split ? malloc(sizeof(float) * (size_t)(B * nsplit * part)) : NULL;
    int failed = by_split && !parts;
    const int64_t tasks = by_split ? B * nsplit : B;
    /* one task (a single row with at most SPLIT keys: batch-1 decode of a short context) gains nothing from
     * a team; the calling thread runs the same code alone, without waking the others or their buffers */
    #pragma omp parallel num_threads(tasks > 1 ? nthreads : 1)
    {
        att_buf buf;
        void *mem = failed ? NULL : alloc_buf(&buf, H, D);
        if (!mem) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (!mem) continue;
            const int64_t b = by_split ? t / nsplit : t, len = key_lens[b], first = first_key(len, window);
            att_range r = {tables + (row_seq ? row_seq[b] : b) * max_nb, 0, 0, 0, Hkv, (len - 1) / bs};
            if (by_split) { /* one split's partial of every head into parts: m [H], l [H], u [H, D] */
                const int64_t sp = t % nsplit;
                if (sp < first / SPLIT || sp * SPLIT >= len) continue;
                split_range(&r, first, len, sp);
                float *pp = parts + t * part;
                att_buf one = buf;
                one.m = pp, one.l = pp + H, one.u = pp + 2 * H;
                partial(&src, path, q + b * H * D, &r, &one);
                continue;
            }
            for (int64_t sp = first / SPLIT; sp * SPLIT < len; sp++) {
                split_range(&r, first, len, sp);
                partial(&src, path, q + b * H * D, &r, &buf);
                merge(buf.M, buf.L, buf.U, buf.m, buf.l, buf.u, H, D, sp == first / SPLIT);
            }
            finish(buf.M, buf.L, buf.U, sinks, out + b * H * D, H, D, vrot);
        }
        if (by_split) {
            #pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < B * Hkv; t++) {
                if (!mem) continue;
                const int64_t b = t / Hkv, hk = t % Hkv, len = key_lens[b], first = first_key(len, window);
                for (int64_t sp = first / SPLIT; sp * SPLIT < len; sp++) {
                    const float *pp = parts + (b * nsplit + sp) * part, *m = pp + hk * G;
                    merge(buf.M, buf.L, buf.U, m, m + H, pp + 2 * H + hk * G * D, G, D, sp == first / SPLIT);
                }
                finish(buf.M, buf.L, buf.U, sinks ? sinks + hk * G : NULL, out + (b * H + hk * G) * D, G, D,
                       vrot);
            }
        }
        free(mem);
    }
    free(parts);
    return failed ? -1 : 0;
}
