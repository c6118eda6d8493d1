/* The one thread and tile driver of the packed-weight matmuls (tile_driver.h). */
#include <stdlib.h>

#include "omp_range.h"
#include "tile_driver.h"

static inline int td_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* This thread's groups [g0, g1): for each block of rows and of k, every group against every mr rows
 * (a lone row: two groups at a time where the plan is wide). */
static void td_walk(const td_plan *p, const void *a, const void *ws, td_tile_fn tile, int64_t g0, int64_t g1) {
    for (int64_t m0 = 0; m0 < p->M; m0 += p->rows) {
        const int64_t m1 = m0 + p->rows < p->M ? m0 + p->rows : p->M;
        for (int64_t k0 = 0; k0 < p->K; k0 += p->KC) {
            const int64_t kc = p->K - k0 < p->KC ? p->K - k0 : p->KC;
            const int flags = p->flags | (k0 ? TD_ACC : 0) | (k0 + kc == p->K ? TD_LAST : 0);
            for (int64_t g = g0; g < g1;) {
                if (p->wide && m1 - m0 == 1 && g + 1 < g1) {
                    tile(a, ws, 1, 2, g, m0, k0, kc, flags);
                    g += 2;
                    continue;
                }
                for (int64_t m = m0; m < m1; m += p->mr)
                    tile(a, ws, m1 - m < p->mr ? (int)(m1 - m) : p->mr, 1, g, m, k0, kc, flags);
                g++;
            }
        }
    }
}

int ridgeline_td_run(const td_plan *p, const void *a, td_prep_fn prep, td_tile_fn tile, int nthreads) {
    const int own = p->M <= p->own_rows;
    const int64_t copies = own && nthreads > 1 ? nthreads : 1;
    const size_t stride = (p->ws_bytes + 63) & ~(size_t)63;
    unsigned char *ws = NULL;
    if (prep && stride) {
        ws = aligned_alloc(64, (size_t)copies * stride);
        if (!ws) return -3;
    }
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t r0 = 0, r1 = p->M, g0, g1;
        unsigned char *w = ws ? ws + (own ? td_thread() : 0) * stride : NULL;
        if (prep) {
            if (!own) omp_range(p->M, &r0, &r1);
            prep(a, w, r0, r1);
            if (!own) {
                #pragma omp barrier
            }
        }
        omp_range(p->groups, &g0, &g1);
        td_walk(p, a, w, tile, g0, g1);
    }
    free(ws);
    return 0;
}
