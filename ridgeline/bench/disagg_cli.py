"""`ridgeline bench disagg`: the KV transfer cost per token on this machine (connectors x KV formats x
prompt lengths) and the engine's own prefill and decode-step cost, stored in the local profile for
`ridgeline advise disagg`; with --goodput, a 1P1D
deployment against 2 co-located replicas on long prompts under a TPOT SLO (bench/disagg_goodput.py)."""
from __future__ import annotations

import argparse
import json
import os

from ridgeline.cli_parser import output_file, positive_int


def _list(kind):
    def parse(text: str):
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
        if not items:
            raise argparse.ArgumentTypeError("expected at least one value")
        return items
    return parse


def add_disagg_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("disagg", help="KV transfer cost per token (shm, tcp; bf16, int8), and 1P1D vs 2 "
                                       "co-located replicas' goodput",
                        description=__doc__)
    p.add_argument("--model", default="smollm2-135m",
                   help="the model whose KV shape is moved, and the engine measured and served (--goodput)")
    p.add_argument("--kv", type=_list(str), default=["bf16", "int8"], metavar="F,F",
                   help="KV formats: bf16 int8 fp8 int4 f32")
    p.add_argument("--connectors", type=_list(str), default=["shm", "tcp"], metavar="C,C", help="connectors")
    p.add_argument("--lengths", type=_list(int), default=[128, 512, 2048], metavar="N,N",
                   help="prompt lengths in tokens")
    p.add_argument("--reps", type=positive_int, default=5, help="timed transfers per configuration (median kept)")
    p.add_argument("--no-save", action="store_true", help="do not store the result in the local profile")
    p.add_argument("--no-engine", dest="engine", action="store_false",
                   help="skip measuring the engine's prefill (--prompt-len tokens) and decode step on --model, which "
                        "`advise disagg --simulate` scales to a device table")
    p.add_argument("--json", default=None, type=output_file, metavar="FILE", help="also write the result as JSON (default: none)")
    g = p.add_argument_group("goodput (1P1D vs 2 co-located replicas)")
    g.add_argument("--goodput", action="store_true", help="run the serving comparison too (minutes)")
    g.add_argument("--prompt-len", type=positive_int, default=1024, help="prompt tokens per request")
    g.add_argument("--output-len", type=positive_int, default=32, help="output tokens per request")
    g.add_argument("--num-requests", type=positive_int, default=16, help="requests per deployment")
    g.add_argument("--request-rate", type=float, default=0.25, help="Poisson arrivals per second")
    g.add_argument("--ttft-slo-ms", type=float, default=10000.0, help="time-to-first-token SLO")
    g.add_argument("--tpot-slo-ms", type=float, default=150.0, help="time-per-output-token SLO")
    g.add_argument("--kv-connector", default="shm", choices=["shm", "tcp"], help="1P1D's connector")
    g.add_argument("--kv-cache-dtype", default="auto", help="both deployments' --kv-cache-dtype")
    g.add_argument("--trace-out", default=None, type=output_file, metavar="FILE",
                   help="write the request trace (JSONL: arrival, prompt_tokens, output_tokens) for advise --simulate (default: none)")
    p.set_defaults(func=cmd_bench_disagg)
    return p


def _shape(model: str):
    from ridgeline.advisor.model_config import resolve_spec
    from ridgeline.measure.kv_transfer import Shape

    s = resolve_spec(model)
    return Shape(s.num_layers, s.num_kv_heads, s.head_dim)


def format_transfer(result: dict) -> str:
    lines = [f"KV transfer on this machine ({result['shape']}; {result['load_note']})",
             f"{'connector':>9} {'kv':>5} {'B/token':>8} " + " ".join(f"{n:>9}" for n in result["lengths"])
             + f" {'fixed':>9} {'us/token':>9} {'GB/s':>6} {'CPU us/token':>12}"]
    for c, by_kv in result["connectors"].items():
        for kv, r in by_kv.items():
            pts = " ".join(f"{s * 1e3:>7.2f}ms" for _, s in r["points"])
            rate = r["bytes_per_token"] / r["per_token_s"] / 1e9 if r["per_token_s"] > 0 else float("inf")
            lines.append(f"{c:>9} {kv:>5} {r['bytes_per_token']:>8} {pts} {r['fixed_s'] * 1e3:>7.2f}ms "
                         f"{r['per_token_s'] * 1e6:>9.3f} {rate:>6.2f} {r['cpu_per_token_s'] * 1e6:>12.3f}")
    return "\n".join(lines)


def cmd_bench_disagg(args: argparse.Namespace) -> int:
    from ridgeline.advisor import transfer_profile
    from ridgeline.measure.kv_transfer import measure

    shape = _shape(args.model)
    load = os.getloadavg()[0]
    result = {"model": args.model, "lengths": args.lengths, "reps": args.reps, "cores": os.cpu_count(),
              "load_avg_1m": load,
              "shape": f"{shape.num_layers} layers x {shape.num_kv_heads} KV heads x {shape.head_dim}",
              "load_note": f"load average {load:.1f} on {os.cpu_count()} cores" + (" (under load)" if load > 1 else ""),
              "connectors": measure(shape, args.connectors, args.kv, args.lengths, args.reps)}
    print(format_transfer(result), flush=True)
    if not args.no_save:
        print(f"stored in {transfer_profile.save('transfer', result)}")
    out = {"transfer": result}
    if args.engine:
        from ridgeline.bench.disagg_engine import format_engine, measure_engine
        out["engine"] = measure_engine(args.model, args.prompt_len, kv_cache_dtype=args.kv_cache_dtype)
        print(format_engine(out["engine"]), flush=True)
        if not args.no_save:
            transfer_profile.save("engine", out["engine"])
    if args.goodput:
        from ridgeline.bench.disagg_goodput import run_goodput
        out["goodput"] = run_goodput(args)
        if not args.no_save:
            transfer_profile.save("goodput", out["goodput"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
