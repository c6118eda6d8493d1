"""`ridgeline bench quant`: the precision ladder on one model, in one process.

Each rung loads the model once and is timed (bench/quant_speed.py) and scored against the unquantized
reference (eval/harness.py: perplexity on the held-out text, teacher-forced top-1 agreement, mean KL)
before the next loads. The reference is the first rung, `none` in --dtype (bf16 where the CPU has it).
Rungs: none, int8, int4, int4-sym, w8a8, w4a8, every other registered --quantization value, and gguf, gguf-a8
for a GGUF model. One table, and a Pareto plot (quality vs decode speed, point size = weight bytes).
Achieved weight bandwidth (batch-1 decode: bytes of linear weights x tok/s) and matmul rate (prefill:
2 x linear weights, the LM head excepted, x tok/s; attention left out) stand beside this machine's
measured peaks when the advisor has measured them (`ridgeline advise --hardware local`).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from ridgeline.cli_parser import output_file, positive_int
from ridgeline.errors import InvalidRequestError
from ridgeline.measure.record import describe_machine, machine_info, write_json

SPECIAL = {"none": {"quantization": "none"}, "int4-sym": {"quantization": "int4", "quant_symmetric": True}}


def ladder(names: list[str] | None, is_gguf: bool) -> dict[str, dict]:
    """rung name -> engine options; the reference (none) always first."""
    from ridgeline.formats.options import QUANTIZATIONS
    known = ["none", "int8", "int4", "int4-sym", "w8a8", "w4a8"]
    known += [q for q in QUANTIZATIONS if q not in known and q not in ("auto", "gguf", "gguf-a8")]
    known += ["gguf", "gguf-a8"] if is_gguf else []
    for n in names or []:
        if n not in known:
            raise InvalidRequestError(f"--ladder: unknown rung {n!r} for this model; rungs: {', '.join(known)}",
                                      "ladder")
    picked = [n for n in known if names is None or n in names or n == "none"]
    return {n: SPECIAL.get(n, {"quantization": n}) for n in picked}


def _linear_params(engine) -> int:
    from ridgeline.layers.linear import Linear
    return sum(m.in_features * m.out_features for name, m in engine.runner.model.named_modules()
               if isinstance(m, Linear) and name != "lm_head")


def _peaks() -> dict | None:
    try:
        from ridgeline.advisor.local_profile import cached_profile
        return cached_profile()
    except Exception:  # the advisor is optional here: no peaks, no comparison
        return None


def run_ladder(args: argparse.Namespace, rungs: dict[str, dict], base: dict) -> list[dict]:
    from ridgeline.bench.quant_speed import measure_speeds
    from ridgeline.engine.run import start_engine
    from ridgeline.eval.harness import Evaluator, Setting

    ready: dict[str, object] = {}

    def make_engine(opts: dict):
        key = repr(sorted(opts.items()))
        return ready.pop(key) if key in ready else start_engine(args.model, **opts)

    ev = Evaluator(make_engine, {**base, **rungs["none"]}, args.window, args.max_tokens or None, args.prompts,
                   args.gen_tokens, args.progress, log=lambda line: print(line, file=sys.stderr))
    ref = ev.start()
    rows = []
    for name, opts in rungs.items():
        t0 = time.perf_counter()
        engine = ev.ref if name == "none" else make_engine({**base, **opts})
        speed = measure_speeds(engine, args.repeats, args.output_len, args.prefill_prompts, args.prefill_len,
                               args.batch)
        row = {"name": name, "options": opts, "weight_formats": engine.info.weight_formats,
               "weight_bytes": engine.info.weight_bytes, "linear_params": _linear_params(engine), **speed}
        if name == "none":
            q = ref
        else:
            ready[repr(sorted({**base, **opts}.items()))] = engine
            del engine
            q = ev.measure(Setting(name, opts))
        row.update(perplexity=q.perplexity, ppl_ref=ref.perplexity, agreement=q.agreement, kl=q.kl,
                   seconds=time.perf_counter() - t0)
        rows.append(row)
        gc.collect()
        print(f"{name}: done in {row['seconds']:.0f}s: {json.dumps(row)}", file=sys.stderr)
    return rows


def table(rows: list[dict], peaks: dict | None) -> str:
    head = (f"{'setting':<10}{'weights MB':>11}{'decode b1':>11}{'GB/s':>7}{'prefill':>10}{'GOP/s':>8}"
            f"{'decode bN':>11}{'ppl':>9}{'vs ref':>9}{'top-1':>8}{'KL':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        gbs = r["weight_bytes"] * r["decode_b1_tok_s"] / 1e9
        gops = 2 * r["linear_params"] * r["prefill_tok_s"] / 1e9
        agree = "-" if r["agreement"] is None else f"{r['agreement']:.4f}"
        kl = "-" if r["kl"] is None else f"{r['kl']:.5f}"
        lines.append(f"{r['name']:<10}{r['weight_bytes'] / 1e6:>11.1f}{r['decode_b1_tok_s']:>11.1f}{gbs:>7.1f}"
                     f"{r['prefill_tok_s']:>10.0f}{gops:>8.0f}{r['decode_batch_tok_s']:>11.0f}"
                     f"{r['perplexity']:>9.3f}{100 * (r['perplexity'] / r['ppl_ref'] - 1):>+8.2f}%{agree:>8}{kl:>9}")
    base = rows[0]
    lines.append("speed-up vs " + base["name"] + ": " + "; ".join(
        f"{r['name']} decode {r['decode_b1_tok_s'] / base['decode_b1_tok_s']:.2f}x, prefill "
        f"{r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x, batch decode "
        f"{r['decode_batch_tok_s'] / base['decode_batch_tok_s']:.2f}x" for r in rows[1:]))
    if peaks:
        flops = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in peaks.get("flops", {}).items())
        lines.append(f"measured peaks (advisor profile, {peaks.get('measured_at', '?')}): memory read "
                     f"{peaks['bandwidth'] / 1e9:.1f} GB/s; matmul GOP/s {flops}")
    else:
        lines.append("no measured peaks yet (`ridgeline advise --local` measures and caches them)")
    return "\n".join(lines)


def cmd_quant(args: argparse.Namespace) -> int:
    from ridgeline.engine.args import engine_kwargs
    from ridgeline.models.resolve import resolve_model_source
    names = [n.strip() for n in args.ladder.split(",") if n.strip()] if args.ladder else None
    rungs = ladder(names, resolve_model_source(args.model, progress=args.progress)[1] is not None)
    base = {k: v for k, v in engine_kwargs(args).items()
            if k not in ("quantization", "quant_group_size", "quant_symmetric")}
    base["enable_prefix_caching"] = False  # every timed prompt computes
    base.setdefault("kv_cache_memory", None)
    base["kv_cache_memory"] = base["kv_cache_memory"] or "512MiB"
    machine = machine_info()
    print(describe_machine(machine), file=sys.stderr)
    rows = run_ladder(args, rungs, base)
    peaks = _peaks()
    print(table(rows, peaks))
    if args.plot:
        from ridgeline.bench.quant_plot import plot_pareto
        plot_pareto(rows, args.plot, f"{args.model}: quality vs batch-1 decode speed")
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        write_json(args.json, {"command": "bench quant", "model": args.model, "machine": machine, "rows": rows,
                               "peaks": peaks, "window": args.window, "batch": args.batch})
    return 0


def add_quant_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("quant", help="the precision ladder: bytes, speeds and quality of each quantization",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ladder", default=None, metavar="A,B,...",
                   help="only these rungs (none is always measured: it is the reference); default: all")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="timed runs of each speed; the best")
    p.add_argument("--output-len", type=positive_int, default=64, metavar="N", help="decode tokens timed")
    p.add_argument("--prefill-prompts", type=positive_int, default=8, metavar="N", help="prompts prefilled at once")
    p.add_argument("--prefill-len", type=positive_int, default=512, metavar="N", help="tokens per prefill prompt")
    p.add_argument("--batch", type=positive_int, default=32, metavar="N", help="requests in the batch decode")
    p.add_argument("--window", type=positive_int, default=512, metavar="N", help="perplexity window, tokens")
    p.add_argument("--max-tokens", type=int, default=8192, metavar="N",
                   help="held-out tokens scored (0: the whole text)")
    p.add_argument("--prompts", type=int, default=8, metavar="N", help="greedy divergence prompts")
    p.add_argument("--gen-tokens", type=int, default=32, metavar="N", help="tokens per divergence prompt")
    p.add_argument("--plot", type=output_file, default=None, metavar="PNG", help="write the Pareto plot here (default: none)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the rows to FILE (default: none)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.set_defaults(func=cmd_quant)
    return p
