/* Single-thread CPU time of batch-1 decode attention at depth against a plain read of the same bytes
 * in the same paged layout (the rate that access pattern allows), over `layers` separate caches walked
 * in turn as a decode step walks its layers (so a layer's KV is not still cached from its last call).
 * Build and run (KERNEL: the kernel source to time, default the checkout's):
 *   gcc -O3 -march=native -fopenmp -ffast-math -fno-finite-math-only scripts/paged_decode_bench.c -o /tmp/pdb -lm
 *   /tmp/pdb [keys=6000] [format: bf16|int8] [layers=30] [rounds=5] [kernel: time the kernel alone]
 * Prints per layer: the kernel's us, the plain read's us (no software prefetch, and 4 blocks ahead). */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#ifndef KERNEL_C
#define KERNEL_C "../ridgeline/kernels/paged_attention.c"
#endif
#include KERNEL_C

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void *huge(size_t bytes) {
    bytes = (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    void *p = aligned_alloc(2u << 20, bytes);
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 1, bytes);
    return p;
}

/* the bytes the kernel reads, split by split: K blocks then V blocks, each block contiguous */
static __attribute__((noinline)) __m512i stream(const char *k, const char *v, const uint16_t *ks, const uint16_t *vs,
                                                const int64_t *table, int64_t n, int64_t bs, int64_t blk_bytes,
                                                int64_t sc_bytes, int pf) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    const int64_t nb = (n - 1) / bs + 1, per = SPLIT / bs;
    for (int64_t s0 = 0; s0 < nb; s0 += per) {
        const int64_t s1 = s0 + per < nb ? s0 + per : nb;
        for (int w = 0; w < 2; w++)
            for (int64_t b = s0; b < s1; b++) {
                const char *p = (w ? v : k) + table[b] * blk_bytes;
                if (pf && b + 4 < s1) prefetch_bytes((w ? v : k) + table[b + 4] * blk_bytes, blk_bytes);
                for (int64_t i = 0; i + 256 <= blk_bytes; i += 256) {
                    a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(p + i));
                    a1 = _mm512_add_epi32(a1, _mm512_loadu_si512(p + i + 64));
                    a2 = _mm512_add_epi32(a2, _mm512_loadu_si512(p + i + 128));
                    a3 = _mm512_add_epi32(a3, _mm512_loadu_si512(p + i + 192));
                }
                if (sc_bytes) {
                    const char *sp = (const char *)(w ? vs : ks) + table[b] * sc_bytes;
                    for (int64_t i = 0; i < sc_bytes; i += 64) a0 = _mm512_add_epi32(a0, _mm512_loadu_si512(sp + i));
                }
            }
    }
    return _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 6000, L = argc > 3 ? atoll(argv[3]) : 30;
    const int i8 = argc > 2 && !strcmp(argv[2], "int8"), rounds = argc > 4 ? atoi(argv[4]) : 5;
    const int ways = argc > 5 && !strcmp(argv[5], "kernel") ? 1 : 3;
    const int64_t H = 9, Hkv = 3, D = 64, bs = 16, nb = (n - 1) / bs + 1, NB = nb + 1;
    const int fmt = i8 ? KV_I8 : KV_BF16, vb = i8 ? D : 2 * D;
    const int64_t blk = bs * Hkv * vb, sblk = i8 ? bs * Hkv * 2 : 0;
    char **k = malloc(L * sizeof *k), **v = malloc(L * sizeof *v);
    uint16_t **ks = calloc(L, sizeof *ks), **vs = calloc(L, sizeof *vs);
    srand(1);
    for (int64_t l = 0; l < L; l++) {
        k[l] = huge(NB * blk), v[l] = huge(NB * blk);
        for (int64_t i = 0; i < NB * blk; i++) k[l][i] = (char)(rand() & (i8 ? 0x7f : 0x3f)), v[l][i] = (char)(rand() & (i8 ? 0x7f : 0x3f));
        if (i8) {
            ks[l] = huge(NB * sblk), vs[l] = huge(NB * sblk);
            for (int64_t i = 0; i < NB * sblk / 2; i++) ks[l][i] = vs[l][i] = 0x2000; /* fp16 2^-7 */
        }
    }
    int64_t *table = malloc(nb * sizeof *table);
    for (int64_t i = 0; i < nb; i++) table[i] = i + 1;
    for (int64_t i = nb - 1; i > 0; i--) { int64_t j = rand() % (i + 1), t = table[i]; table[i] = table[j]; table[j] = t; }
    float *q = malloc(H * D * sizeof *q), *out = malloc(H * D * sizeof *out);
    for (int64_t i = 0; i < H * D; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    const int64_t len = n;
    double best[3] = {1e9, 1e9, 1e9};
    volatile int sink = 0;
    for (int r = 0; r < rounds; r++)
        for (int which = 0; which < ways; which++) {
            const double t0 = cpu_s();
            for (int64_t l = 0; l < L; l++) {
                if (which == 0)
                    ridgeline_paged_decode(q, k[l], v[l], ks[l], vs[l], NULL, fmt | fmt << 8, table, NULL, &len, out, 1,
                                           H, Hkv, D, bs, nb, 0, 0.125f, 1);
                else
                    sink += _mm512_reduce_add_epi32(stream(k[l], v[l], ks[l], vs[l], table, n, bs, blk, sblk, which == 2));
            }
            const double t = (cpu_s() - t0) / L;
            best[which] = t < best[which] ? t : best[which];
        }
    const double mb = 2.0 * n * (Hkv * vb + (i8 ? Hkv * 2 : 0)) / 1e6;
    uint32_t sum = 0; /* the output's bits, to compare builds */
    for (int64_t i = 0; i < H * D; i++) {
        uint32_t u;
        memcpy(&u, out + i, 4);
        sum = sum * 31 + u;
    }
    printf("%s keys %lld: %.2f MB/layer  kernel %.0f us (%.1f GB/s)  read %.0f us (%.1f GB/s)  read+pf %.0f us (%.1f GB/s)  kernel/read %.2f  out %08x\n",
           i8 ? "int8" : "bf16", (long long)n, mb, best[0] * 1e6, mb / best[0] / 1e3, best[1] * 1e6, mb / best[1] / 1e3,
           best[2] * 1e6, mb / best[2] / 1e3, best[0] / (best[1] < best[2] ? best[1] : best[2]), sum);
    return sink == 12345;
}
