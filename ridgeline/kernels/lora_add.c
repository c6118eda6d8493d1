/* Per-row low-rank additions to a linear layer's output (LoRA adapters): y [T, N] += for each row t whose slot
 * s = slot_of[t] >= 0, on each of slot s's pieces, B (A x[t]) on the piece's columns. A slot's pieces on one
 * linear share one shrink (their A matrices stacked, R rows in all); each piece expands its own rank's share of
 * it, times the adapter's scale, by its B. The decoder stack calls it after each linear's matmul and bias,
 * and so does the module path (ridgeline/lora/manager.py): the two are the same code, bit for bit.
 *
 * Each row's sums run in a fixed order (shrink: sh[j] = the sums over k in order of x[k] At[k][j] over the
 * first and the second half of k, added; expand:
 * d[n] = sum over the rank in order of sh[k] Bt[k][n]; then y[n] += d[n]); rows of one adapter go in tiles
 * that share each weight load but not their arithmetic, so a row's result never depends on the other rows of
 * the call or on how many threads share them. Weights are transposed, At [K, R] and
 * Bt [rank, cols], so every step is a contiguous row of 16-lane FMAs; fp32, or bf16 as the adapter's file holds
 * them (widened exactly to fp32 as they load: x and the sums stay fp32). A piece's share of the shrink is
 * multiplied by its scale before its expand.
 *
 * table: [slots, then per slot a pointer (0: the slot has nothing on this linear) to
 *         [pieces, R, At, 1 if bf16 (else fp32), then per piece LA_FIELDS: first column, columns, rank, its
 *          offset in R, Bt, the scale's fp32 bits]]
 * Returns 0, -1 when its row lists cannot be allocated, or -2 on a malformed table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

enum { LA_COL, LA_COLS, LA_RANK, LA_ROFF, LA_B, LA_SCALE, LA_FIELDS };
#define LA_HEAD 4   /* pieces, R, At, bf16 */
#define LA_BLOCK 4  /* 16-lane column vectors a pass keeps per row (64 columns) */
#define LA_MR 4     /* rows of one slot a tile takes together, sharing each weight load */
#define LA_MAX_R 1024
#define LA_PAR_TILES 2 /* tiles from which they are split across threads */

#define PTR(T, v) ((T *)(intptr_t)(v))

static inline int omp_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
static inline int omp_team(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* the table layout, for the Python side to check against its own: 0 an entry's head fields, 1 a piece's fields */
int ridgeline_lora_fields(int which) { return which == 0 ? LA_HEAD : which == 1 ? LA_FIELDS : -1; }

/* 16 weights from w (fp32, or bf16 widened exactly) under mask m */
#ifdef __AVX512F__
static inline __m512 load_w(const void *w, int64_t i, int bf16, __mmask16 m) {
    if (!bf16) return _mm512_maskz_loadu_ps(m, (const float *)w + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

static inline float w_at(const void *w, int64_t i, int bf16) {
    if (!bf16) return ((const float *)w)[i];
    const uint32_t b = (uint32_t)((const uint16_t *)w)[i] << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

/* for each of mr rows i: out_i [n] = (acc ? out_i : 0) + sum over k < kn, in order, of a_i[k] * w[k][n] (w rows
 * of stride ld). A row's sums are the same whatever mr is and however the columns are blocked: the rows of a
 * tile share each weight load, not their arithmetic. */
static void rows_times(int mr, const float *const *a, int64_t kn, const void *w, int bf16, int64_t ld, int64_t n,
                       float *const *out, int acc) {
#ifdef __AVX512F__
    for (int64_t c0 = 0; c0 < n; c0 += 16 * LA_BLOCK) {
        const int64_t left = n - c0, nv = left >= 16 * LA_BLOCK ? LA_BLOCK : (left + 15) / 16;
        __m512 s[LA_MR][LA_BLOCK];
        __mmask16 m[LA_BLOCK];
        for (int v = 0; v < nv; v++) {
            const int64_t rem = left - 16 * v;
            m[v] = rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1);
            for (int i = 0; i < mr; i++) s[i][v] = _mm512_setzero_ps();
        }
        for (int64_t k = 0; k < kn; k++) {
            __m512 wv[LA_BLOCK];
            for (int v = 0; v < nv; v++) wv[v] = load_w(w, k * ld + c0 + 16 * v, bf16, m[v]);
            for (int i = 0; i < mr; i++) {
                const __m512 ak = _mm512_set1_ps(a[i][k]);
                for (int v = 0; v < nv; v++) s[i][v] = _mm512_fmadd_ps(ak, wv[v], s[i][v]);
            }
        }
        for (int i = 0; i < mr; i++)
            for (int v = 0; v < nv; v++) {
                float *o = out[i] + c0 + 16 * v;
                const __m512 r = acc ? _mm512_add_ps(_mm512_maskz_loadu_ps(m[v], o), s[i][v]) : s[i][v];
                _mm512_mask_storeu_ps(o, m[v], r);
            }
    }
#else
    for (int i = 0; i < mr; i++)
        for (int64_t j = 0; j < n; j++) {
            float s = 0.f;
            for (int64_t k = 0; k < kn; k++) s += a[i][k] * w_at(w, k * ld + j, bf16);
            out[i][j] = acc ? out[i][j] + s : s;
        }
#endif
}

/* A tile of mr rows of one slot (rows idx[0..mr) of x and y), thread t's share of it among nthr (1: all of it;
 * with more, every thread of the team calls it). The shrink is always two halves of k, sh = lo + hi (thread h
 * takes half h), then each piece's scaled share is expanded by blocks of 64 columns dealt round the threads
 * and added into the rows of y: the same arithmetic however many threads share the tile. */
static void lora_tile(const int64_t *e, int mr, const int64_t *idx, const float *x, float *y, int64_t N, int64_t K,
                      int t, int nthr, float (*half)[LA_MR][LA_MAX_R]) {
    const int bf16 = (int)e[3];
    const int64_t R = e[1], Kh = K / 2;
    const float *xa[LA_MR], *pa[LA_MR];
    float *ho[LA_MR], *yo[LA_MR], part[LA_MR][LA_MAX_R];
    for (int h = 0; h < 2; h++) {
        if (h % nthr != t) continue;
        for (int i = 0; i < mr; i++) xa[i] = x + idx[i] * K + h * Kh, ho[i] = half[h][i];
        const int64_t off = h * Kh * R;
        const void *w = bf16 ? (const void *)(PTR(const uint16_t, e[2]) + off) : (const void *)(PTR(const float, e[2]) + off);
        rows_times(mr, xa, h ? K - Kh : Kh, w, bf16, R, R, ho, 0);
    }
    if (nthr > 1) {
        #pragma omp barrier
    }
    for (int i = 0; i < mr; i++) pa[i] = part[i];
    int64_t item = 0;
    for (int64_t p = 0; p < e[0]; p++) {
        const int64_t *f = e + LA_HEAD + p * LA_FIELDS, r = f[LA_RANK], cols = f[LA_COLS];
        const uint32_t bits = (uint32_t)f[LA_SCALE];
        float scale;
        memcpy(&scale, &bits, 4);
        int ready = 0;
        for (int64_t c0 = 0; c0 < cols; c0 += 16 * LA_BLOCK, item++) {
            if (item % nthr != t) continue;
            if (!ready) {
                for (int i = 0; i < mr; i++)
                    for (int64_t k = 0; k < r; k++)
                        part[i][k] = (half[0][i][f[LA_ROFF] + k] + half[1][i][f[LA_ROFF] + k]) * scale;
                ready = 1;
            }
            for (int i = 0; i < mr; i++) yo[i] = y + idx[i] * N + f[LA_COL] + c0;
            const void *w = bf16 ? (const void *)(PTR(const uint16_t, f[LA_B]) + c0) : (const void *)(PTR(const float, f[LA_B]) + c0);
            const int64_t n = cols - c0 < 16 * LA_BLOCK ? cols - c0 : 16 * LA_BLOCK;
            rows_times(mr, pa, r, w, bf16, cols, n, yo, 1);
        }
    }
}

int ridgeline_lora_add(const int64_t *table, const int64_t *slot_of, const float *x, float *y, int64_t T, int64_t N,
                       int64_t K, int nt) {
    const int64_t slots = table[0];
    for (int64_t s = 0; s < slots; s++) { /* every table checked before any row is touched */
        const int64_t *e = PTR(const int64_t, table[1 + s]);
        if (!e) continue;
        if (e[0] < 1 || e[1] < 1 || e[1] > LA_MAX_R || !e[2]) return -2;
        for (int64_t p = 0; p < e[0]; p++) {
            const int64_t *f = e + LA_HEAD + p * LA_FIELDS;
            if (f[LA_COL] < 0 || f[LA_COLS] <= 0 || f[LA_COL] + f[LA_COLS] > N || f[LA_RANK] <= 0 ||
                f[LA_ROFF] < 0 || f[LA_ROFF] + f[LA_RANK] > e[1] || !f[LA_B])
                return -2;
        }
    }
    /* the rows of each slot in row order, cut into tiles of up to LA_MR: (slot, first of its rows, count) */
    int64_t *idx = malloc((size_t)(T > 0 ? T : 1) * sizeof *idx), *tiles = malloc((size_t)(T > 0 ? T : 1) * 3 * sizeof *tiles);
    if (!idx || !tiles) {
        free(idx), free(tiles);
        return -1;
    }
    int64_t used = 0, ntiles = 0;
    for (int64_t s = 0; s < slots; s++) {
        if (!table[1 + s]) continue;
        const int64_t first = used;
        for (int64_t t = 0; t < T; t++)
            if (slot_of[t] == s) idx[used++] = t;
        for (int64_t r = first; r < used; r += LA_MR) {
            tiles[3 * ntiles] = s, tiles[3 * ntiles + 1] = r;
            tiles[3 * ntiles + 2] = used - r < LA_MR ? used - r : LA_MR;
            ntiles++;
        }
    }
    if (ntiles == 1 && nt > 1) { /* one tile (a decode row): its halves and column blocks shared by two threads */
        float half[2][LA_MR][LA_MAX_R];
        #pragma omp parallel num_threads(2)
        lora_tile(PTR(const int64_t, table[1 + tiles[0]]), (int)tiles[2], idx + tiles[1], x, y, N, K, omp_thread(),
                  omp_team(), half);
    } else {
        #pragma omp parallel for num_threads(nt) schedule(static) if (ntiles >= LA_PAR_TILES)
        for (int64_t i = 0; i < ntiles; i++) {
            float half[2][LA_MR][LA_MAX_R];
            lora_tile(PTR(const int64_t, table[1 + tiles[3 * i]]), (int)tiles[3 * i + 2], idx + tiles[3 * i + 1], x, y,
                      N, K, 0, 1, half);
        }
    }
    free(idx), free(tiles);
    return 0;
}
