"""`ridgeline eval MODEL [engine options]`: registered by ridgeline/cli.py when this module exists."""
from __future__ import annotations

import argparse
import sys
import time

from ridgeline.cli_parser import non_negative_int, output_file, positive_int
from ridgeline.errors import InvalidRequestError

DEFAULT_KV_MEMORY = "512MiB"  # per engine (two are loaded at once): a window batch, not a serving load


def register(subparsers, command: str | None = None) -> None:
    from ridgeline.engine.args import add_engine_args
    p = subparsers.add_parser(
        "eval", help="quality of a (quantized) model against the unquantized one on held-out text",
        description="Perplexity on the shipped held-out text (prompt logprobs, windows of --window tokens), "
                    "top-1 agreement and mean KL divergence of next-token distributions against the same "
                    "model unquantized, and greedy tokens generated before the first divergence. Engine "
                    "options (--quantization, ...) choose the setting evaluated; --sweep quantizes one "
                    "component at a time and ranks them.")
    p.add_argument("model_name", nargs="?", default=None, metavar="MODEL",
                   help="HF folder, .gguf file, hub id or built-in alias, as with --model (default: --model's)")
    g = p.add_argument_group("evaluation")
    g.add_argument("--window", type=positive_int, default=512, metavar="N", help="tokens per context window")
    g.add_argument("--max-tokens", type=non_negative_int, default=16384, metavar="N",
                   help="held-out tokens scored at most, in whole windows (0: the whole text, ~75k tokens)")
    g.add_argument("--prompts", type=non_negative_int, default=16, metavar="N",
                   help="greedy generations compared with the reference's (0: none)")
    g.add_argument("--gen-tokens", type=positive_int, default=64, metavar="N", help="tokens per generation")
    g.add_argument("--sweep", action="store_true",
                   help="quantize one component at a time (all weights, each kind of linear layer alone, ...) "
                        "in the format --quantization names (int8 when none) and rank them by mean KL")
    g.add_argument("--kv-eviction-budgets", type=_int_list, default=None, metavar="N[,N...]",
                   help="measure KV eviction at each budget (tokens of KV per request), with each policy of "
                        "--kv-eviction-policies; the reference keeps every token (default: only the engine "
                        "options' --kv-eviction setting)")
    g.add_argument("--kv-eviction-policies", type=_policy_list, default=None, metavar="P[,P...]",
                   help="with --kv-eviction-budgets: streaming, h2o or both (default: --kv-eviction's)")
    g.add_argument("--json", type=output_file, default=None, metavar="PATH",
                   help="also write the results as JSON (default: no file)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    add_engine_args(p)
    p.set_defaults(func=cmd_eval)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"budgets must be positive, got {text!r}")
    return values


def _policy_list(text: str) -> tuple[str, ...]:
    from ridgeline.engine.kv_eviction import POLICIES
    values = tuple(text.split(","))
    if not values or any(v not in POLICIES for v in values):
        raise argparse.ArgumentTypeError(f"policies are {', '.join(POLICIES)}, got {text!r}")
    return values


def eviction_settings(options: dict, budgets: tuple[int, ...], policies: tuple[str, ...] | None,
                      weight_format: str | None = None) -> list:
    """One setting per (policy, budget); the policies default to the options' kv_eviction."""
    from ridgeline.eval.harness import Setting
    policies = policies or ((options.get("kv_eviction"),) if options.get("kv_eviction", "none") != "none" else ())
    if not policies:
        raise InvalidRequestError("--kv-eviction-budgets needs --kv-eviction or --kv-eviction-policies",
                                  "kv_eviction_budgets")
    out = []
    for policy in policies:
        for b in budgets:
            opts = {"kv_eviction": policy, "kv_eviction_budget": b}
            out.append(Setting(setting_name(weight_format, {**options, **opts}), opts))
    return out


def _options(args: argparse.Namespace) -> dict:
    from ridgeline.engine.args import engine_kwargs
    kw = engine_kwargs(args)
    if kw.get("kv_cache_memory") is None:
        kw["kv_cache_memory"] = DEFAULT_KV_MEMORY
    return kw


def setting_name(weight_format: str | None, options: dict) -> str | None:
    """What the evaluated setting changes from the reference: its weight format and its KV cache
    types (K/V when they differ); None when it changes nothing lossy."""
    kv = options.get("kv_cache_dtype") or "auto"
    k, v = options.get("kv_cache_dtype_k") or kv, options.get("kv_cache_dtype_v") or kv
    kv_name = None if k == v == "auto" else (k if k == v else f"{k}/{v}")
    parts = [weight_format] if weight_format else []
    if kv_name is not None:
        parts.append(f"KV {kv_name}")
    if options.get("kv_eviction", "none") != "none":
        parts.append(f"{options['kv_eviction']} {options.get('kv_eviction_budget', 1024)} "
                     f"({options.get('kv_sink_tokens', 4)} sinks)")
    return " + ".join(parts) or None


def _format_label(args: argparse.Namespace) -> str | None:
    """The weight format the evaluated setting loads: gguf for a GGUF model's kept blocks (auto on a .gguf)."""
    from ridgeline.formats.options import format_name, resolve
    from ridgeline.models.resolve import resolve_model_source
    quantization = args.quantization
    if quantization in ("auto", "gguf", "gguf-a8"):
        quantization = resolve(quantization, resolve_model_source(args.model, progress=args.progress)[1])
    return quantization if quantization in ("gguf", "gguf-a8") else format_name(quantization, args.quant_group_size,
                                                                                args.quant_symmetric)


def cmd_eval(args: argparse.Namespace) -> int:
    from ridgeline.measure.record import describe_machine, machine_info, write_json
    from ridgeline.engine.run import start_engine
    from ridgeline.eval import report
    from ridgeline.eval.harness import Evaluator, Setting
    from ridgeline.eval.sweep import ranking, sweep_settings

    if args.model_name is not None:
        args.model = args.model_name
    if args.window < 2:
        raise InvalidRequestError("--window must be at least 2 tokens", "window")
    options = _options(args)
    fmt = _format_label(args)
    name = setting_name(fmt, options)
    settings = sweep_settings(options) if args.sweep else ([Setting(name, {})] if name else [])
    if args.kv_eviction_budgets:
        if options.get("kv_eviction", "none") != "none":
            settings = [s for s in settings if s.options]  # the budgets replace the options' own one
        settings += eviction_settings(options, args.kv_eviction_budgets, args.kv_eviction_policies, fmt)
    machine = machine_info()
    print(describe_machine(machine), file=sys.stderr)

    def make_engine(opts: dict):
        return start_engine(args.model, **opts)

    ev = Evaluator(make_engine, options, args.window, args.max_tokens or None, args.prompts, args.gen_tokens,
                   args.progress, log=lambda line: print(line, file=sys.stderr))
    t0 = time.perf_counter()
    ref = ev.start()
    if not ev.windows:
        raise InvalidRequestError(f"--window {args.window} is longer than the held-out text", "window")
    print(f"text       held-out: {len(ev.windows)} windows x {args.window} tokens; {len(ev.prompts)} prompts x "
          f"{args.gen_tokens} greedy tokens; reference {ref.weight_formats}", file=sys.stderr)
    results = [ev.measure(s) for s in settings]
    print(report.table(ref, results))
    for line in report.position_lines(results):
        print(line)
    for line in report.memory_lines(results, args.window):
        print(line)
    ranked = ranking(results) if args.sweep else []
    if ranked:
        print("\n".join(report.ranking_lines(ranked, ref)))
    if args.json:
        write_json(args.json, {"command": "eval", "model": args.model, "options": options, "machine": machine,
                               "window": args.window, "windows": len(ev.windows), "tokens": ev.num_tokens,
                               "prompts": len(ev.prompts), "gen_tokens": args.gen_tokens,
                               "reference": ref.to_dict(), "results": [r.to_dict() for r in results],
                               "ranking": [r.name for r in ranked], "seconds": time.perf_counter() - t0})
    return 0
