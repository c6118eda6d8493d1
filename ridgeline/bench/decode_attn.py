"""One layer's decode attention at long context, alone: the KV bytes a batch-1 step reads over the
time the kernel takes (GB/s), by KV format and thread count.

Random K/V in a paged cache of the model's shapes (blocks shuffled, as a long-running pool leaves
them), one query row at depth n. Wall time (median of `repeats` after a warm-up): the number to
hold against the machine's read bandwidth. Run: python3 -m ridgeline.bench.decode_attn
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from ridgeline.kernels import cpu_attention
from ridgeline.kv_spec import KV_FORMATS, KVCacheSpec
from ridgeline.layers.kv_cache import allocate_kv


def layer_cache(fmt: str, n: int, kv_heads: int, head_dim: int, block_size: int = 16, seed: int = 0):
    """(LayerKV, block table [1, nb]) holding n random positions in format fmt"""
    nb = -(-n // block_size)
    spec = KVCacheSpec(KV_FORMATS[fmt], 1, kv_heads, head_dim, block_size)
    kv = allocate_kv(spec, nb + 1, torch.device("cpu"))[0]
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(nb * block_size, kv_heads, head_dim, generator=g) for _ in range(2))
    kv.write(torch.arange(block_size, (nb + 1) * block_size), k, v)
    table = (torch.randperm(nb, generator=g) + 1).view(1, nb)
    return kv, table


def kv_bytes(kv, n: int) -> int:
    """bytes of K and V (with scales) of n positions of one layer"""
    per = sum(t[0, 0].numel() * t.element_size() for t in (kv.k, kv.v, kv.k_scale, kv.v_scale) if t is not None)
    return per * n


def time_decode(fmt: str, n: int, threads: int, heads: int = 9, kv_heads: int = 3, head_dim: int = 64,
                repeats: int = 50) -> dict:
    kv, table = layer_cache(fmt, n, kv_heads, head_dim)
    q = torch.randn(1, heads, head_dim)
    lens = torch.tensor([n])
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        def call():
            return cpu_attention.paged_decode(q, kv.k, kv.v, table, lens, head_dim ** -0.5, None,
                                              kv_format=kv.c_format, k_scale=kv.k_scale, v_scale=kv.v_scale)
        call()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev)
    s = statistics.median(times)
    b = kv_bytes(kv, n)
    return {"format": fmt, "tokens": n, "threads": threads, "us": s * 1e6, "mb": b / 1e6, "gb_s": b / s / 1e9}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="6000,8000")
    ap.add_argument("--formats", default="bf16,int8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=50)
    a = ap.parse_args(argv)
    print(f"{'format':>8} {'tokens':>7} {'threads':>7} {'us':>9} {'KV MB':>7} {'GB/s':>6}")
    for n in map(int, a.lengths.split(",")):
        for fmt in a.formats.split(","):
            for t in map(int, a.threads.split(",")):
                r = time_decode(fmt, n, t, repeats=a.repeats)
                print(f"{fmt:>8} {n:>7} {t:>7} {r['us']:>9.0f} {r['mb']:>7.2f} {r['gb_s']:>6.1f}")


if __name__ == "__main__":
    main()
