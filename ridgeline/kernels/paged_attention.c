/* Decode attention straight from the paged KV cache: one query token per sequence, no gather.
 * q [B, H, D] fp32, caches [NB, bs, Hkv, D] fp32 or bf16, block_tables [S, max_nb], key_lens [B] -> out [B, H, D].
 * The cache is read block by block, each position's Hkv*D row once (memory-bound at large B), in
 * two passes: scores (kept in a per-thread buffer), then the softmax-weighted V sum. A task is one
 * sequence, or one (sequence, KV head) when there are too few sequences to keep the threads busy. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline float bf16_to_float(uint16_t v) {
    union { uint32_t u; float f; } x = {.u = (uint32_t)v << 16};
    return x.f;
}

#define ATTEND attend_f32
#define KV_T float
#define KV_LOAD(x) (x)
#include "paged_attention_attend.h"
#undef ATTEND
#undef KV_T
#undef KV_LOAD

#define ATTEND attend_bf16
#define KV_T uint16_t
#define KV_LOAD(x) bf16_to_float(x)
#include "paged_attention_attend.h"
#undef ATTEND
#undef KV_T
#undef KV_LOAD

#ifdef __AVX512F__
#include "reduce16.h"
#include "vexp.h"
#define FAST attend_f32_fast
#define KV_T float
#define QK_W 16
#define QV_T __m512
#define Q_PREP(dst, src) (*(dst) = _mm512_loadu_ps(src))
#define QK_STEP(acc, qv, kp) _mm512_fmadd_ps(qv, _mm512_loadu_ps(kp), acc)
#define V_LOAD16(p) _mm512_loadu_ps(p)
#include "paged_attention_avx512.h"
#undef FAST
#undef KV_T
#undef QK_W
#undef QV_T
#undef Q_PREP
#undef QK_STEP
#undef V_LOAD16
#define HAVE_F32_FAST 1
#endif

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
#define V_LOAD16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#include "paged_attention_avx512.h"
#define HAVE_BF16_FAST 1
#endif

/* B query rows. Row b attends to the first key_lens[b] positions of the sequence whose block table
 * is tables[row_seq ? row_seq[b] : b]: one decode token per sequence, or (row_seq given) the rows of
 * prefill chunks, each a query at its own position (key_lens = position + 1: causal). */
int ridgeline_paged_decode(const float *q, const void *kc, const void *vc, int kv_bf16, const int64_t *tables,
                           const int64_t *row_seq, const int64_t *key_lens, float *out, int64_t B, int64_t H,
                           int64_t Hkv, int64_t D, int64_t bs, int64_t max_nb, int64_t window, float scale,
                           int nthreads) {
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; b++) max_len = key_lens[b] > max_len ? key_lens[b] : max_len;
    const int64_t per_task = B < 2 * nthreads ? 1 : Hkv; /* KV heads per task */
    const int64_t tasks = B * (Hkv / per_task);
#ifdef HAVE_BF16_FAST
    const int fast_bf16 = D % 32 == 0 && D <= ATT_MAX_D;
#else
    const int fast_bf16 = 0;
#endif
#ifdef HAVE_F32_FAST
    const int fast_f32 = D % 16 == 0 && D <= ATT_MAX_D;
#else
    const int fast_f32 = 0;
#endif
    (void)fast_bf16;
    (void)fast_f32;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        const size_t nscores = (size_t)((H / Hkv) * per_task * max_len);
        /* + the prepared query, 64-byte aligned */
        float *scores = malloc(sizeof(float) * (nscores + (size_t)(H * D)) + 64);
        void *qbuf = scores ? (void *)(((uintptr_t)(scores + nscores) + 63) & ~(uintptr_t)63) : NULL;
        (void)qbuf;
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (!scores) continue;
            const int64_t b = t / (Hkv / per_task), h0 = (t % (Hkv / per_task)) * per_task;
            const int64_t *table = tables + (row_seq ? row_seq[b] : b) * max_nb;
#if defined(HAVE_BF16_FAST) || defined(HAVE_F32_FAST)
            if (kv_bf16 ? fast_bf16 : fast_f32) {
#ifdef HAVE_BF16_FAST
                if (kv_bf16)
                    attend_bf16_fast(q + b * H * D, kc, vc, table, key_lens[b], out + b * H * D, H,
                                     Hkv, h0, h0 + per_task, D, bs, window, scale, scores, qbuf);
#endif
                if (!kv_bf16)
                    attend_f32_fast(q + b * H * D, kc, vc, table, key_lens[b], out + b * H * D, H,
                                    Hkv, h0, h0 + per_task, D, bs, window, scale, scores, qbuf);
                continue;
            }
#endif
            if (kv_bf16)
                attend_bf16(q + b * H * D, kc, vc, table, key_lens[b], out + b * H * D, H, Hkv,
                            h0, h0 + per_task, D, bs, window, scale, scores);
            else
                attend_f32(q + b * H * D, kc, vc, table, key_lens[b], out + b * H * D, H, Hkv, h0,
                   h0 + per_task, D, bs, window, scale, scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
