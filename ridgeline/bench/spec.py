"""`ridgeline bench spec`: speculative decoding against no speculation, measured in the same run.

For each workload (code-edit: the reply repeats the prompt; chat) and batch size, the same prompts
run greedy (or sampled at --temperature, unseeded) through one engine per proposer:
with speculation off (k = 0), with k pinned at each --k, and with the goodput controller (k up to
the largest --k). Settings alternate within each repeat (the order rotates between repeats);
medians over --repeats are reported, and the speed-up is the median of each repeat's ratio to that
repeat's plain run. The structured workloads constrain every request to its schema in every setting
(speculation off included), so `--methods grammar` measures grammar drafts against the same constraint
without them; `structured-forced` first runs the whole corpus once, prints each schema's share of
forced tokens, and then runs the 10 schemas with the largest share. Greedy output is the same in every setting (checked), so every setting
produces the same tokens; sampled outputs follow the same distribution, not the same draws. Beside each measured speed-up: the
model E / (1 + c k), with E = (1 - a^(k+1)) / (1 - a) from the measured acceptance a, k the mean
drafts per verification, and c the measured extra cost of a decode step per drafted token (step
time with drafts / without - 1, over k).
"""
from __future__ import annotations

import argparse
import sys
import time

from ridgeline.bench.spec_runs import Setting, repeated_runs, summarize, timed_run, timed_runs
from ridgeline.bench.throughput import dtype_name
from ridgeline.bench.workloads import make_workload
from ridgeline.cli_parser import non_negative_float, output_file, positive_int
from ridgeline.measure.record import write_json


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def build_engines(args: argparse.Namespace) -> dict:
    from ridgeline.engine.args import engine_kwargs
    from ridgeline.engine.run import start_engine
    engines = {}
    for label in args.methods:
        method, _, layers = label.partition(":")  # layer-skip:L (else --speculative-layers)
        kw = {**engine_kwargs(args), "speculative_method": method, "num_speculative_tokens": max(args.k),
              "speculative_controller": "on"}
        parts = method.split("+")  # chained proposers (ngram+eagle)
        if not {"draft", "eagle"} & set(parts):
            kw["draft_model"] = None
        if "layer-skip" in parts:
            kw["speculative_layers"] = _ints(layers)[0] if layers else kw["speculative_layers"]
        else:
            kw["speculative_layers"] = None
        if kw.get("kv_cache_memory") is None:
            kw["kv_cache_memory"] = "1GiB"  # several engines share the machine
        engines[label] = engine = start_engine(args.model, **kw)
        print(engine.info.summary(), file=sys.stderr)
    return engines


def settings_for(method: str, ks: list[int], controller: bool) -> list[Setting]:
    out = [Setting(method, 0)] + [Setting(method, k) for k in ks]
    return out + ([Setting(method, max(ks), True)] if controller else [])


TOP_FORCED = 10  # structured-forced: the schemas with the largest share of forced tokens


def forced_prompts(args: argparse.Namespace, engine, n: int) -> list:
    """structured-forced: the corpus once, greedy, speculation off; each schema's forced share printed;
    n prompts on the TOP_FORCED schemas with the largest share."""
    from ridgeline.bench.structured_workload import corpus_schemas, forced_share, structured_workload
    tok = engine.tokenizer
    everyone = structured_workload("structured", tok, len(corpus_schemas()), seed=args.workload_seed)
    run = timed_runs(engine, everyone, 16, Setting("off", 0), args.output_len, args.ignore_eos)
    shares = forced_share(engine.structured.backend, everyone, run.outputs)
    ranked = sorted(shares, key=lambda k: (-shares[k][0] / max(shares[k][1], 1), k))
    print("forced-token share by schema (greedy, the whole corpus): "
          + ", ".join(f"{k} {f / max(t, 1):.2f}" for k, (f, t) in ((k, shares[k]) for k in ranked)))
    total_f, total_t = sum(f for f, _ in shares.values()), sum(t for _, t in shares.values())
    top = ranked[:TOP_FORCED]
    print(f"whole corpus {total_f / max(total_t, 1):.2f}; structured-forced runs {', '.join(top)}")
    return structured_workload("structured", tok, n, seed=args.workload_seed, only=top)


def sweep(args: argparse.Namespace, engines: dict) -> list[dict]:
    rows = []
    tok = next(iter(engines.values())).tokenizer
    for workload in args.workloads:
        n = max(args.batch_sizes + [args.requests])
        if workload == "structured-forced":
            prompts = forced_prompts(args, next(iter(engines.values())), n)
        else:
            prompts = make_workload(workload, tok, n, seed=args.workload_seed)
        # warm-up: kernels, and the controller's first measurements
        for method, engine in engines.items():
            for s in settings_for(method, args.k, args.controller):
                timed_run(engine, prompts[:2], s, 16, args.ignore_eos, args.temperature)
        for B in args.batch_sizes:
            for method, engine in engines.items():
                settings = settings_for(method, args.k, args.controller)
                runs = repeated_runs(engine, prompts[:max(B, args.requests)], B, settings, args.repeats,
                                     args.output_len, args.ignore_eos, args.temperature)
                plain = runs[settings[0]]
                for s in settings:
                    row = {"workload": workload, "batch": B, **summarize(s, runs[s], plain, not args.temperature)}
                    rows.append(row)
                    print_row(row)
    return rows


SAME = {True: "yes", False: "NO", None: "-"}  # None: sampled outputs differ by setting, as they may


def print_header() -> None:
    head = (f"{'workload':<18}{'batch':>6}  {'setting':<16}{'tok/s':>8}{'decode':>8}{'speed-up':>9}"
            f"{'accept':>8}{'len':>6}{'drafted':>9}{'draft ms':>9}{'c':>7}{'E':>6}{'model':>7}  same")
    print(head)
    print("-" * len(head))


def print_row(r: dict) -> None:
    extra = (f"{r['acceptance']:>8.2f}{r['mean_accepted_length']:>6.2f}{r['drafted']:>9}{r['draft_ms']:>9.1f}"
             f"{r['c']:>7.3f}{r['E']:>6.2f}{r['model_speedup']:>6.2f}x" if "c" in r else " " * 53)
    print(f"{r['workload']:<18}{r['batch']:>6}  {r['setting']:<16}{r['tok_s']:>8.1f}{r['decode_tok_s']:>8.1f}"
          f"{r['speedup']:>8.2f}x{extra}  {SAME[r['same_output']]}", flush=True)


def cmd_spec(args: argparse.Namespace) -> int:
    from ridgeline.measure.record import describe_machine, machine_info
    wall0 = time.perf_counter()
    machine = machine_info()
    print(describe_machine(machine), file=sys.stderr)
    engines = build_engines(args)
    info = next(iter(engines.values())).info
    print(f"\nSpeculative decoding: {args.model} ({dtype_name(info.dtype)}) on {machine['cpu']}, "
          f"{machine['torch_threads']} threads; "
          f"{f'sampled at temperature {args.temperature:g}' if args.temperature else 'greedy'}, "
          f"up to {args.output_len} tokens per request, "
          f"median of {args.repeats}; speed-up in decode tok/s vs speculation off, same engine, same run")
    print_header()
    rows = sweep(args, engines)
    wall = time.perf_counter() - wall0
    print(f"bench wall time {wall:.0f}s")
    if args.plot:
        from ridgeline.bench.spec_plot import plot_speedup
        plot_speedup(rows, args.plot, f"{args.model} ({dtype_name(info.dtype)}) on {machine['cpu']}")
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        write_json(args.json, {"command": "spec", "machine": machine, "model": args.model,
                               "dtype": dtype_name(info.dtype), "output_len": args.output_len,
                               "temperature": args.temperature,
                               "repeats": args.repeats, "rows": rows, "wall_s": wall})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_spec_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("spec", help="speculative decoding vs none: batch size x proposer x k, with the model",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", type=_names, default=["ngram"], metavar="M[,M...]",
                   help="proposers to compare (registered names; layer-skip:L for the first L layers, so "
                        "several L can be compared in one run)")
    p.add_argument("--k", type=_ints, default=[2, 4], metavar="K[,K...]", help="draft lengths to pin")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 4, 16, 64], metavar="B[,B...]",
                   help="requests decoding together")
    p.add_argument("--workloads", type=_names, default=["code-edit", "chat"], metavar="W[,W...]",
                   help="code-edit (the reply repeats the prompt), chat, structured (JSON schemas; "
                        "structured-forced: the 10 with the most forced tokens), or any bench workload")
    p.add_argument("--no-controller", dest="controller", action="store_false",
                   help="skip the runs with the goodput controller")
    p.add_argument("--output-len", type=positive_int, default=128, metavar="N", help="most tokens per request")
    p.add_argument("--requests", type=positive_int, default=8, metavar="N",
                   help="requests per run at least: a batch size B below N runs them B at a time, one batch "
                        "after another, so batch 1 is not one prompt's luck")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --output-len tokens")
    p.add_argument("--temperature", type=non_negative_float, default=0.0, metavar="T",
                   help="sample at T, unseeded (0: greedy, every setting's output checked equal)")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="runs of every setting")
    p.add_argument("--workload-seed", type=int, default=0, metavar="N", help="seed of the workloads' prompts")
    p.add_argument("--plot", type=output_file, default=None, metavar="PNG", help="write a plot of speed-up vs batch size (default: none)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the rows to FILE (default: none)")
    p.set_defaults(func=cmd_spec)
    return p
