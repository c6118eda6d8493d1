"""Micro-benchmark of the weight matmuls: bf16 packed (gemm_packed.c) vs int8 and int4 (gemm_int8.c,
gemm_int4.c), w8a8 / w4a8 (gemm_a8.c), fp8 / mxfp8 (gemm_fp8.c) and mxfp4 / nvfp4 (gemm_fp4.c) on SmolLM2-135M's layer matrices (30 layers x qkv, o,
gate_up, down, plus the LM head), random weights, cycled so they come from memory as in decode.
Interleaved rounds, best of each.

python3 scripts/quant_kernels.py [--rows 1,8,64] [--rounds 5] [--formats bf16,int8,int4,int4-sym,w8a8,w4a8]
Prints ms per pass over all matrices, weight GB/s (bytes of packed weights and scales per pass / time)
and GFLOP/s; per shape at one row with --shapes.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ridgeline.kernels import cpu_gemm, cpu_quant  # noqa: E402
from ridgeline.kernels import cpu_fpquant  # noqa: E402
from ridgeline.formats import fpq, rtn  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
LAYERS, HEAD = 30, (49152, 576)


def make(fmt: str, w: torch.Tensor):
    if fmt == "bf16":
        return cpu_gemm.PackedWeight(w.to(torch.bfloat16))
    if fmt.startswith(("fp8", "mx", "nv")):
        t = fpq.quantize(w, fmt)
        return (cpu_fpquant.PackedFp4 if fmt in ("mxfp4", "nvfp4") else cpu_fpquant.PackedFp8)(t)
    if fmt in ("int8", "w8a8"):
        return (cpu_quant.PackedInt8 if fmt == "int8" else cpu_quant.PackedW8A8)(rtn.quantize_int8(w))
    sym = "sym" in fmt
    group = int(fmt.rsplit("-g", 1)[1]) if "-g" in fmt else 32
    packed = cpu_quant.PackedW4A8 if fmt.startswith("w4a8") else cpu_quant.PackedInt4
    return packed(rtn.quantize_int4(w, group, sym))


CLOCK = time.perf_counter


def time_pass(mats, xs, rows: int) -> float:
    t = CLOCK()
    for p in mats:
        p(xs[p.K][:rows])
    return CLOCK() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", default="bf16,int8,int4,int4-sym")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--shapes", action="store_true", help="also time each shape alone at one row")
    ap.add_argument("--threads", type=int, default=None,
                    help="1: time this thread's CPU time (robust to a loaded machine; one core's rate)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        if args.threads == 1:
            global CLOCK
            CLOCK = time.thread_time
    torch.manual_seed(0)
    protos = {name: torch.randn(*shape) * 0.05 for name, shape in {**SHAPES, "head": HEAD}.items()}
    formats = args.formats.split(",")
    mats = {}
    for fmt in formats:  # distinct copies per layer so a pass streams every byte from memory
        mats[fmt] = [make(fmt, protos[n] + 0.001 * i) for i in range(args.layers) for n in SHAPES]
        mats[fmt].append(make(fmt, protos["head"]))
    xs = {K: torch.randn(256, K) for K in (576, 1536)}
    flops_row = 2 * sum(p.N * p.K for p in mats[formats[0]])
    print(f"{torch.get_num_threads()} threads; one pass = {len(mats[formats[0]])} matrices, "
          f"{flops_row / 2 / 1e6:.1f} M weights")
    for rows in map(int, args.rows.split(",")):
        best = {f: float("inf") for f in formats}
        for _ in range(args.rounds):
            for f in formats:
                best[f] = min(best[f], time_pass(mats[f], xs, rows))
        for f in formats:
            gb = sum(p.nbytes for p in mats[f]) / best[f] / 1e9
            print(f"rows {rows:>4}  {f:<10} {best[f] * 1e3:8.2f} ms  {gb:6.1f} GB/s  "
                  f"{flops_row * rows / best[f] / 1e9:7.1f} GFLOP/s  x{best[formats[0]] / best[f]:.2f}")
    if args.shapes:
        for name in (*SHAPES, "head"):
            line = []
            for f in formats:
                p = make(f, protos[name])
                t = min(time_pass([p] * 200, xs, 1) for _ in range(3)) / 200
                line.append(f"{f} {t * 1e6:7.1f} us ({p.nbytes / t / 1e9:5.1f} GB/s)")
            print(f"{name:<8}" + "  ".join(line))


if __name__ == "__main__":
    main()
