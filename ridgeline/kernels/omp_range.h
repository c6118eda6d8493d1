/* This thread's contiguous share [*lo, *hi) of n work items, inside an OpenMP parallel region
 * (everything when built without OpenMP). */
#pragma once
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static inline void omp_range(int64_t n, int64_t *lo, int64_t *hi) {
    int t = 0, nt = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    nt = omp_get_num_threads();
#endif
    const int64_t per = (n + nt - 1) / nt;
    *lo = t * per < n ? t * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}
