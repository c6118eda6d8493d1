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
#if defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
/* AMD Zen (GCC 12 tunes a Zen 5 as znver3): on a Zen 5, 2- and 3-row tiles (a verification's rows)
 * ran ~5% faster 8 KB ahead than 2 KB, one row the same (docs/performance.md) */
#define W_PF_BYTES 8192
#else
#define W_PF_BYTES 2048 /* measured on the Xeon */
#endif
#endif
#define W_PF_ROWS 4

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

