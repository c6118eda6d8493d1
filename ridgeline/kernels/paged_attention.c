/* Decode attention straight from the paged KV cache: one query token per sequence, no gather.
 * q [B, H, D] fp32, caches [NB, bs, Hkv, D] fp32 or bf16, block_tables [B, max_nb], key_lens [B] -> out [B, H, D].
 * The cache is read block by block, each position's Hkv*D row once (memory-bound at large B), in
 * two passes: scores (kept in a per-thread buffer), then the softmax-weighted V sum. A task is one
 * sequence, or one (sequence, KV head) when there are too few sequences to keep the threads busy. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "reduce16.h"
#include "vexp.h"
#include "paged_attention_bf16.h"
#define HAVE_BF16_DOT 1
#endif

int ridgeline_paged_decode(const float *q, const void *kc, const void *vc, int kv_bf16, const int64_t *tables,
                           const int64_t *key_lens, float *out, int64_t B, int64_t H, int64_t Hkv,
                           int64_t D, int64_t bs, int64_t max_nb, int64_t window, float scale,
                           int nthreads) {
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; b++) max_len = key_lens[b] > max_len ? key_lens[b] : max_len;
    const int64_t per_task = B < 2 * nthreads ? 1 : Hkv; /* KV heads per task */
    const int64_t tasks = B * (Hkv / per_task);
#ifdef HAVE_BF16_DOT
    const int dot = D % 32 == 0 && D <= ATT_MAX_D;
#else
    const int dot = 0;
#endif
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        const size_t nscores = (size_t)((H / Hkv) * per_task * max_len);
        float *scores = malloc(sizeof(float) * nscores + sizeof(uint16_t) * (size_t)(H * D)); /* + bf16 q */
        uint16_t *qbuf = scores ? (uint16_t *)(scores + nscores) : NULL;
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (!scores) continue;
            const int64_t b = t / (Hkv / per_task), h0 = (t % (Hkv / per_task)) * per_task;
            if (kv_bf16 && dot)
                attend_bf16_dot(q + b * H * D, kc, vc, tables + b * max_nb, key_lens[b], out + b * H * D, H,
                                Hkv, h0, h0 + per_task, D, bs, window, scale, scores, qbuf);
            else if (kv_bf16)
                attend_bf16(q + b * H * D, kc, vc, tables + b * max_nb, key_lens[b], out + b * H * D, H, Hkv,
                            h0, h0 + per_task, D, bs, window, scale, scores);
            else
                attend_f32(q + b * H * D, kc, vc, tables + b * max_nb, key_lens[b], out + b * H * D, H, Hkv, h0,
                   h0 + per_task, D, bs, window, scale, scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
