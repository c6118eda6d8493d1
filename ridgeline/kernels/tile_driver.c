/* The one thread and tile driver of the packed-weight matmuls (tile_driver.h). */
#include <stdlib.h>

#include "omp_range.h"
#include "tile_driver.h"

static _Thread_local const uint32_t *td_bits; /* ridgeline_td_filter's, for this thread's next call */
static _Thread_local int64_t td_bits_n, td_last_groups;

void ridgeline_td_filter(const uint32_t *bits, int64_t n) {
    td_bits = bits;
    td_bits_n = n;
}

int64_t ridgeline_td_last_live_groups(void) { return td_last_groups; }

static inline int td_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* 1 if bits holds a set bit in [lo, hi) */
static int td_any(const uint32_t *bits, int64_t lo, int64_t hi) {
    for (; lo < hi; lo = (lo | 31) + 1) {
        const int64_t left = hi - lo;
        uint32_t b = bits[lo >> 5] >> (lo & 31);
        if (left < 32) b &= (1u << left) - 1;
        if (b) return 1;
    }
    return 0;
}

/* This thread's groups: live [i0, i1), or groups [i0, i1) without a list; for each block of rows and of
 * k, every group against every mr rows (a lone row: two adjacent groups at a time where the plan is wide). */
static void td_walk(const td_plan *p, const void *a, const void *ws, td_tile_fn tile, const int64_t *live,
                    int64_t i0, int64_t i1) {
    for (int64_t m0 = 0; m0 < p->M; m0 += p->rows) {
        const int64_t m1 = m0 + p->rows < p->M ? m0 + p->rows : p->M;
        for (int64_t k0 = 0; k0 < p->K; k0 += p->KC) {
            const int64_t kc = p->K - k0 < p->KC ? p->K - k0 : p->KC;
            const int flags = p->flags | (k0 ? TD_ACC : 0) | (k0 + kc == p->K ? TD_LAST : 0);
            for (int64_t i = i0; i < i1;) {
                const int64_t g = live ? live[i] : i;
                if (p->wide && m1 - m0 == 1 && i + 1 < i1 && (!live || live[i + 1] == g + 1)) {
                    tile(a, ws, 1, 2, g, m0, k0, kc, flags);
                    i += 2;
                    continue;
                }
                for (int64_t m = m0; m < m1; m += p->mr)
                    tile(a, ws, m1 - m < p->mr ? (int)(m1 - m) : p->mr, 1, g, m, k0, kc, flags);
                i++;
            }
        }
    }
}

int ridgeline_td_run(const td_plan *p, const void *a, td_prep_fn prep, td_tile_fn tile, int nthreads) {
    const uint32_t *bits = td_bits;
    const int64_t n = td_bits_n;
    td_bits = NULL; /* the filter is this call's only */
    int64_t *live = NULL, groups = p->groups;
    if (bits && p->cols > 0) { /* the groups holding a wanted column */
        live = malloc((size_t)(p->groups > 0 ? p->groups : 1) * sizeof *live);
        if (!live) return -3;
        groups = 0;
        for (int64_t g = 0; g < p->groups; g++) {
            const int64_t lo = g * p->cols, hi = lo + p->cols < n ? lo + p->cols : n;
            if (td_any(bits, lo, hi)) live[groups++] = g;
        }
        if (nthreads > groups) nthreads = groups > 0 ? (int)groups : 1;
    }
    td_last_groups = groups;
    const int own = p->M <= p->own_rows;
    const int64_t copies = own && nthreads > 1 ? nthreads : 1;
    const size_t stride = (p->ws_bytes + 63) & ~(size_t)63;
    unsigned char *ws = NULL;
    if (groups && prep && stride) {
        ws = aligned_alloc(64, (size_t)copies * stride);
        if (!ws) {
            free(live);
            return -3;
        }
    }
    if (groups) {
        #pragma omp parallel num_threads(nthreads)
        {
            int64_t r0 = 0, r1 = p->M, i0, i1;
            unsigned char *w = ws ? ws + (own ? td_thread() : 0) * stride : NULL;
            if (prep) {
                if (!own) omp_range(p->M, &r0, &r1);
                prep(a, w, r0, r1);
                if (!own) {
                    #pragma omp barrier
                }
            }
            omp_range(groups, &i0, &i1);
            td_walk(p, a, w, tile, live, i0, i1);
        }
    }
    free(ws);
    free(live);
    return 0;
}
