/* Software prefetch of a weight stream while a few rows are multiplied (decode): each weight is read
 * once per call, so the kernel runs at the memory's pace only if enough lines are in flight ahead of
 * the loads; the hardware prefetcher alone kept a one-row bf16 matmul near three quarters of a plain
 * read. A tile of at most W_PF_ROWS rows prefetches, into L1 (hint below), the line(s) W_PF_BYTES ahead of what
 * it loads in each of its column groups (a group is one contiguous stream, and a thread's groups are
 * consecutive, so the distance runs on into its next group). Larger tiles are compute-bound and
 * their later row blocks reread the group from L2: no prefetch. No effect on any result. */
#pragma once
#ifdef __SSE__
#include <immintrin.h>
#endif

#ifndef W_PF_BYTES
#if RIDGELINE_CPU_FAMILY == 26
/* AMD Zen 5 (kernels/build.py defines the family: GCC 12 tunes Zen 3, 4 and 5 all as znver3): 2- and 3-row
 * tiles (a verification's rows) ran ~5% faster 8 KB ahead than 2 KB, one row the same */
#define W_PF_BYTES 8192
#elif defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
/* AMD Zen 3/4: the line being loaded, with the hint below and nothing ahead. On a Zen 4 (52 GB/s read),
 * one row of a 262144 x 640 int8-g32 head streamed at ~50 GB/s this way and ~40 GB/s 8 KB ahead (the
 * ahead lines compete with the hardware prefetcher's), and batch-1 decode went 120 -> 126 tok/s on a
 * Gemma-3-270m-shaped Q4_K_M file, 19.2 -> 20.1 (medians of four alternated runs) on a Qwen2.5-3B Q4_0 */
#define W_PF_BYTES 0
#else
#define W_PF_BYTES 2048 /* measured on the Xeon */
#endif
#endif
#ifndef W_PF_ROWS
#define W_PF_ROWS 4
#endif

/* The hint: on AMD Zen non-temporal, elsewhere into every level. A weight is read once a step, so a
 * line kept in the caches only pushes out what the step reuses (the activations, the scratch rows, the
 * KV cache, a draft head's weights). On a Zen 5, batch-1 decode of the default model in bf16 with the
 * hint switched per prompt (ABBA over 24 prompts): plain 173.2 -> 177.4 tok/s, with an EAGLE head
 * drafting 2 tokens 243.7 -> 255.1 (docs/performance.md). */
#ifndef W_PF_HINT
#if defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
#define W_PF_HINT _MM_HINT_NTA
#else
#define W_PF_HINT _MM_HINT_T0
#endif
#endif

/* `lines` consecutive lines from W_PF_BYTES after p, when the tile has at most W_PF_ROWS rows */
static inline __attribute__((always_inline)) void w_prefetch(const void *p, int lines, int mr) {
#ifdef __SSE__
    if (mr <= W_PF_ROWS)
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)p + W_PF_BYTES + 64 * l, W_PF_HINT);
#else
    (void)p; (void)lines; (void)mr;
#endif
}

/* `lines` consecutive lines from `ahead` bytes after p, when the tile has at most W_PF_ROWS rows: a stream read
 * beside the weights' at a slower rate (a kernel's scales), prefetched about as far ahead in k */
static inline __attribute__((always_inline)) void w_prefetch_at(const void *p, int lines, int mr, int ahead) {
#ifdef __SSE__
    if (mr <= W_PF_ROWS)
        for (int l = 0; l < lines; l++) _mm_prefetch((const char *)p + ahead + 64 * l, W_PF_HINT);
#else
    (void)p; (void)lines; (void)mr; (void)ahead;
#endif
}

