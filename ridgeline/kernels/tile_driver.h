/* The thread and tile driver every packed-weight matmul runs (gemm_packed.c, gemm_int8.c,
 * gemm_int8_g32.c, gemm_int4.c, gemm_a8.c, gemm_fp8.c, gemm_fp4.c; tile_driver.c). A kernel describes
 * its call in a td_plan and hands over two callbacks: prep turns rows of x into what its micro-kernels
 * read (bf16 rows, int8 rows with block scales), tile runs its micro-kernel on one tile of y. The
 * driver allocates the prepared copies of x, splits the column groups across threads and walks each
 * thread's groups in blocks of rows and of k. Which tile computes an output never changes its
 * arithmetic: every kernel sums an output's k in the same order whatever the tile, and a k block after
 * the first continues from the partial sums stored in y. So a call may compute only some column groups
 * (ridgeline_td_filter) and every output it computes is the one the full call computes, bit for bit. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define TD_ACC 1       /* tile flags: continue from the partial sums in y (every k block after the first) */
#define TD_LAST 2      /* the last k block: finish the outputs (per-channel scales) */
#define TD_STREAM 4    /* streaming stores, where the kernel's plan asks for them */
#define TD_OWN_ROWS 8  /* up to this many rows every thread prepares all of x into its own copy */

typedef struct {
    int64_t M;        /* rows of x */
    int64_t groups;   /* column groups of the packed weight, split across threads */
    int64_t K, KC;    /* the k a tile's k0, kc count, and k per block (KC = K: one block) */
    int64_t rows;     /* rows of x per block */
    int mr;           /* rows per tile */
    int wide;         /* a block of one row takes two column groups per tile (more independent chains) */
    int flags;        /* or-ed into every tile's flags (TD_STREAM) */
    size_t ws_bytes;  /* bytes of one prepared copy of x; 0 with no prep */
    int64_t own_rows; /* up to this many rows each thread prepares its own copy, with no barrier between
                       * preparing and multiplying; more rows: each thread prepares its share of one
                       * copy and waits for the others. 0: always one shared copy */
    int64_t cols;     /* output columns per column group (group g: columns [g * cols, (g + 1) * cols)); 0: not
                       * said, and no column filter applies */
} td_plan;

/* prepare rows [r0, r1) of x into ws (one copy of ws_bytes, 64-byte aligned) */
typedef void (*td_prep_fn)(const void *args, void *ws, int64_t r0, int64_t r1);
/* rows [m, m + mr) against column groups [g, g + ng), k in [k0, k0 + kc); ws: the prepared x (NULL
 * without a prep); flags: TD_ACC, TD_LAST, and the plan's */
typedef void (*td_tile_fn)(const void *args, const void *ws, int mr, int ng, int64_t g, int64_t m, int64_t k0,
                           int64_t kc, int flags);

/* Runs the call on nthreads: 0, or -3 when the prepared copies (or a filter's list of groups) cannot be
 * allocated. prep may be NULL. */
int ridgeline_td_run(const td_plan *plan, const void *args, td_prep_fn prep, td_tile_fn tile, int nthreads);

/* A column filter for the next ridgeline_td_run on the calling thread (that call takes it, whatever its
 * plan): with bits [ceil(n / 32)] (bit c % 32 of word c / 32: column c wanted, c < n), it computes only
 * the column groups holding a wanted column, split evenly across threads, and leaves every other
 * group's outputs unwritten; where the plan has no cols it computes every group. NULL: no filter. The
 * masked LM head sets it (stack_linear.c: ridgeline_linear_argmax). */
void ridgeline_td_filter(const uint32_t *bits, int64_t n);
/* The column groups the calling thread's last ridgeline_td_run computed (tests). */
int64_t ridgeline_td_last_live_groups(void);
