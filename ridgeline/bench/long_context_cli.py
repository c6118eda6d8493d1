"""The `bench long-context` command: arguments, the table, the plot (measurement: long_context.py)."""
from __future__ import annotations

import argparse
import sys
import time

from ridgeline.bench.long_context import __doc__ as DOC, llama_bench_rates, measure, parse_lengths
from ridgeline.bench.throughput import dtype_name, start
from ridgeline.cli_parser import output_file, positive_int
from ridgeline.measure.record import write_json


def _table(rows: list[dict], bandwidth: float, cpp: dict | None) -> list[str]:
    head = (f"{'length':>7}{'prefill tok/s':>15}{'vs first':>9}{'att share':>10}{'att FLOPs':>10}{'att/mm rate':>12}"
            f"{'decode tok/s':>14}{'floor tok/s':>12}{'of floor':>9}")
    if cpp:
        head += f"{'llama.cpp pp':>14}{'tg':>8}"
    out = [head, "-" * len(head)]
    base = rows[0]["prefill_tok_per_s"]
    for r in rows:
        floor = bandwidth / r["decode_bytes_per_token"]
        r["decode_floor_tok_per_s"] = floor
        line = (f"{r['length']:>7}{r['prefill_tok_per_s']:>15,.0f}{r['prefill_tok_per_s'] / base:>9.0%}"
                f"{r['attention_share_time']:>10.0%}{r['attention_share_flops']:>10.0%}"
                f"{r['attention_gflops'] / r['matmul_gflops']:>12.2f}{r['decode_tok_per_s']:>14.1f}{floor:>12.1f}"
                f"{r['decode_tok_per_s'] / floor:>9.0%}")
        if cpp:
            pp, tg = cpp["pp"].get(r["length"]), cpp["tg"].get(r["length"])
            line += f"{pp or float('nan'):>14,.0f}{tg or float('nan'):>8.1f}"
        out.append(line)
    return out


def plot(rows: list[dict], cpp: dict | None, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["length"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(n, [r["prefill_tok_per_s"] for r in rows], "o-", label="Ridgeline prefill")
    b.plot(n, [r["decode_tok_per_s"] for r in rows], "o-", label="Ridgeline decode")
    b.plot(n, [r["decode_floor_tok_per_s"] for r in rows], ":", label="bandwidth floor")
    if cpp:
        for ax, kind, label in ((a, "pp", "llama.cpp pp"), (b, "tg", "llama.cpp tg")):
            pts = sorted(cpp[kind].items())
            if pts:
                ax.plot([p for p, _ in pts], [t for _, t in pts], "s--", label=label)
    for ax, what in ((a, "prefill tok/s (prompt length)"), (b, "decode tok/s (context depth)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_long_context(args: argparse.Namespace) -> int:
    from ridgeline.advisor.local_profile import local_hardware

    wall0, machine, engine = start(args)
    # 'max': the longest prompt that still leaves room for the decode tokens within max_model_len
    lengths = parse_lengths(args.lengths, engine.max_model_len - args.decode_tokens - 1)
    cpp = llama_bench_rates(args.llama_bench) if args.llama_bench else None
    bandwidth = args.bandwidth * 1e9 if args.bandwidth else local_hardware(verbose=True).bandwidth
    rows = measure(engine, lengths, args.decode_tokens, args.repeats, args.profile_threads)
    info = engine.info
    title = (f"{args.model} ({dtype_name(info.dtype)}, KV {info.kv_format_name}) on {machine['cpu']}, "
             f"{machine['torch_threads']} threads")
    print(f"\nLong context: {title}; prefill in chunks of {engine.config.scheduler.max_num_batched_tokens}, "
          f"decode over {args.decode_tokens} tokens, best of {args.repeats}; read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print("\n".join(_table(rows, bandwidth, cpp)))
    print("att share: one layer's attention / (attention + matmuls), CPU time, "
          f"{args.profile_threads} thread(s); att FLOPs: the advisor's FLOP split; att/mm rate: attention "
          "GFLOP/s over the matmuls'; floor: (weights + KV bytes per token) / read bandwidth")
    if args.plot:
        plot(rows, cpp, args.plot, title)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        write_json(args.json, {"command": "long-context", "machine": machine, "model": args.model,
                               "dtype": dtype_name(info.dtype), "kv_dtype": info.kv_format_name,
                               "bandwidth": bandwidth, "rows": rows, "llama_cpp": cpp,
                               "wall_s": time.perf_counter() - wall0})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_long_context_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("long-context", help="prefill and decode tok/s by context length, attention share, "
                                             "bandwidth floor, llama.cpp beside",
                        description=DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="512,2048,4096,8000,max", metavar="LIST",
                   help="comma-separated prompt lengths; 'max' is the longest the engine takes")
    p.add_argument("--decode-tokens", type=positive_int, default=32, metavar="N", help="decode tokens timed per length")
    p.add_argument("--repeats", type=positive_int, default=2, metavar="N", help="runs per length; the best counts")
    p.add_argument("--profile-threads", type=positive_int, default=1, metavar="N",
                   help="threads of the one-layer attention/matmul profile (CPU time; 1 is the steadiest)")
    p.add_argument("--bandwidth", type=float, default=None, metavar="GB/S",
                   help="memory read bandwidth for the decode floor (default: the advisor's measured profile)")
    p.add_argument("--llama-bench", default=None, metavar="FILE",
                   help="llama-bench -o json output to show beside (pp at n_prompt, tg at n_depth; default: none)")
    p.add_argument("--plot", type=output_file, default=None, metavar="PNG", help="write a plot of both curves (default: none)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the results to FILE (default: none)")
    p.set_defaults(func=cmd_long_context)
    return p
