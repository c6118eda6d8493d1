/* Decode attention straight from the paged KV cache: one query token per sequence, no gather.
 * q [B, H, D], caches [NB, bs, Hkv, D] (fp32), block_tables [B, max_nb], key_lens [B] -> out [B, H, D].
 * Each (sequence, KV head) pair is one task: its G = H / Hkv query heads share every K/V row read.
 * Two passes over the keys: scores (kept in a per-thread buffer), then the softmax-weighted V sum. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int ridgeline_paged_decode(const float *q, const float *kc, const float *vc, const int64_t *tables,
                           const int64_t *key_lens, float *out, int64_t B, int64_t H, int64_t Hkv,
                           int64_t D, int64_t bs, int64_t max_nb, int64_t window, float scale,
                           int nthreads) {
    const int64_t G = H / Hkv;
    int64_t max_len = 0;
    for (int64_t b = 0; b < B; b++) max_len = key_lens[b] > max_len ? key_lens[b] : max_len;
    int failed = 0;
    #pragma omp parallel num_threads(nthreads)
    {
        float *scores = malloc(sizeof(float) * G * (max_len > 0 ? max_len : 1));
        if (!scores) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * Hkv; task++) {
            if (!scores) continue;
            const int64_t b = task / Hkv, hk = task % Hkv, len = key_lens[b];
            const int64_t first = (window > 0 && len > window) ? len - window : 0;
            const int64_t n = len - first;
            const float *qb = q + (b * H + hk * G) * D;
            float *ob = out + (b * H + hk * G) * D;
            for (int64_t j = 0; j < n; j++) {
                const int64_t pos = first + j;
                const int64_t slot = tables[b * max_nb + pos / bs] * bs + pos % bs;
                const float *k = kc + (slot * Hkv + hk) * D;
                for (int64_t g = 0; g < G; g++) {
                    const float *qg = qb + g * D;
                    float s = 0.f;
                    #pragma omp simd reduction(+ : s)
                    for (int64_t d = 0; d < D; d++) s += qg[d] * k[d];
                    scores[g * n + j] = s * scale;
                }
            }
            for (int64_t g = 0; g < G; g++) {
                float *sg = scores + g * n, m = -INFINITY, sum = 0.f;
                for (int64_t j = 0; j < n; j++) m = sg[j] > m ? sg[j] : m;
                for (int64_t j = 0; j < n; j++) {
                    sg[j] = expf(sg[j] - m);
                    sum += sg[j];
                }
                const float inv = 1.f / sum;
                for (int64_t j = 0; j < n; j++) sg[j] *= inv;
                for (int64_t d = 0; d < D; d++) ob[g * D + d] = 0.f;
            }
            for (int64_t j = 0; j < n; j++) {
                const int64_t pos = first + j;
                const int64_t slot = tables[b * max_nb + pos / bs] * bs + pos % bs;
                const float *v = vc + (slot * Hkv + hk) * D;
                for (int64_t g = 0; g < G; g++) {
                    const float p = scores[g * n + j];
                    float *og = ob + g * D;
                    #pragma omp simd
                    for (int64_t d = 0; d < D; d++) og[d] += p * v[d];
                }
            }
        }
        free(scores);
    }
    return failed ? -1 : 0;
}
