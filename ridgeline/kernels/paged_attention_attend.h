/* Body of the decode attention for one KV element type; included by paged_attention.c with
 * ATTEND (function name), KV_T (element type) and KV_LOAD (element -> float) defined. */
static void ATTEND(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *table, int64_t len,
                   float *out, int64_t H, int64_t Hkv, int64_t h0, int64_t h1, int64_t D, int64_t bs,
                   int64_t window, float scale, float *scores) {
    const int64_t G = H / Hkv, first = (window > 0 && len > window) ? len - window : 0, n = len - first;
    const int64_t row = Hkv * D; /* floats between consecutive positions */
    for (int64_t pos = first; pos < len;) { /* one table lookup per block */
        const int64_t blk = pos / bs, stop = (blk + 1) * bs < len ? (blk + 1) * bs : len;
        const KV_T *k = kc + (table[blk] * bs + pos % bs) * row;
        for (; pos < stop; pos++, k += row) {
            for (int64_t hk = h0; hk < h1; hk++) {
                const KV_T *kh = k + hk * D;
                for (int64_t g = 0; g < G; g++) {
                    const float *qg = q + (hk * G + g) * D;
                    float s = 0.f;
                    #pragma omp simd reduction(+ : s)
                    for (int64_t d = 0; d < D; d++) s += qg[d] * KV_LOAD(kh[d]);
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
        const KV_T *v = vc + (table[blk] * bs + pos % bs) * row;
        for (; pos < stop; pos++, v += row) {
            for (int64_t hk = h0; hk < h1; hk++) {
                const KV_T *vh = v + hk * D;
                for (int64_t g = 0; g < G; g++) {
                    const float p = scores[((hk - h0) * G + g) * n + pos - first];
                    float *o = out + (hk * G + g) * D;
                    #pragma omp simd
                    for (int64_t d = 0; d < D; d++) o[d] += p * KV_LOAD(vh[d]);
                }
            }
        }
    }
}
