/* Decode attention straight from the paged KV cache: one query token per sequence, no gather.
 * q [B, H, D], caches [NB, bs, Hkv, D] (fp32), block_tables [B, max_nb], key_lens [B] -> out [B, H, D].
 * The cache is read block by block, each position's Hkv*D row once (memory-bound at large B), in
 * two passes: scores (kept in a per-thread buffer), then the softmax-weighted V sum. A task is one
 * sequence, or one (sequence, KV head) when there are too few sequences to keep the threads busy. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void attend(const float *q, const float *kc, const float *vc, const int64_t *table, int64_t len,
                   float *out, int64_t H, int64_t Hkv, int64_t h0, int64_t h1, int64_t D, int64_t bs,
                   int64_t window, float scale, float *scores) {
    const int64_t G = H / Hkv, first = (window > 0 && len > window) ? len - window : 0, n = len - first;
    const int64_t row = Hkv * D; /* floats between consecutive positions */
    for (int64_t pos = first; pos < len;) { /* one table lookup per block */
        const int64_t blk = pos / bs, stop = (blk + 1) * bs < len ? (blk + 1) * bs : len;
        const float *k = kc + (table[blk] * bs + pos % bs) * row;
        for (; pos < stop; pos++, k += row) {
            for (int64_t hk = h0; hk < h1; hk++) {
                const float *kh = k + hk * D;
                for (int64_t g = 0; g < G; g++) {
                    const float *qg = q + (hk * G + g) * D;
                    float s = 0.f;
                    #pragma omp simd reduction(+ : s)
                    for (int64_t d = 0; d < D; d++) s += qg[d] * kh[d];
                    scores[((hk - h0) * G + g) * n + pos - first] = s * scale;
                }
            }
        }
    }
    for (int64_t r = 0; r < (h1 - h0) * G; r++) {
        float *sr = scores + r * n, m = sr[0], sum = 0.f;
        for (int64_t j = 1; j < n; j++) m = sr[j] > m ? sr[j] : m;
        for (int64_t j = 0; j < n; j++) {
            sr[j] = expf(sr[j] - m);
            sum += sr[j];
        }
        const float inv = 1.f / sum;
        for (int64_t j = 0; j < n; j++) sr[j] *= inv;
        float *o = out + (h0 * G + r) * D;
        for (int64_t d = 0; d < D; d++) o[d] = 0.f;
    }
    for (int64_t pos = first; pos < len;) {
        const int64_t blk = pos / bs, stop = (blk + 1) * bs < len ? (blk + 1) * bs : len;
        const float *v = vc + (table[blk] * bs + pos % bs) * row;
        for (; pos < stop; pos++, v += row) {
            for (int64_t hk = h0; hk < h1; hk++) {
                const float *vh = v + hk * D;
                for (int64_t g = 0; g < G; g++) {
                    const float p = scores[((hk - h0) * G + g) * n + pos - first];
                    float *o = out + (hk * G + g) * D;
                    #pragma omp simd
                    for (int64_t d = 0; d < D; d++) o[d] += p * vh[d];
                }
            }
        }
    }
}

int ridgeline_paged_decode(const float *q, const float *kc, const float *vc, const int64_t *tables,
                           const int64_t *key_lens, float *out, int64_t B, int64_t H, int64_t Hkv,
                           int64_t D, int64_t bs, int64_t max_nb, int64_t window, float scale,
                           int nthreads) {
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; b++) max_len = key_lens[b] > max_len ? key_lens[b] : max_len;
    const int64_t per_task = B < 2 * nthreads ? 1 : Hkv; /* KV heads per task */
    const int64_t tasks = B * (Hkv / per_task);
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        float *scores = malloc(sizeof(float) * (H / Hkv) * per_task * max_len);
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; t++) {
            if (!scores) continue;
            const int64_t b = t / (Hkv / per_task), h0 = (t % (Hkv / per_task)) * per_task;
            attend(q + b * H * D, kc, vc, tables + b * max_nb, key_lens[b], out + b * H * D, H, Hkv, h0,
                   h0 + per_task, D, bs, window, scale, scores);
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
