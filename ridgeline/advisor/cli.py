"""`ridgeline advise [kv|gpus|spec|disagg]`: registered by ridgeline/cli.py."""
from __future__ import annotations

import argparse
import json

DESCRIPTION = """Diagnose the binding wall (capacity, bandwidth, compute, network, SLO contention) of a model on
hardware under a workload, and rank the techniques that pay off, with the arithmetic shown.
  ridgeline advise --model Llama-3.1-70B --hardware H100 --prompt-len 2000 --concurrency 64
  ridgeline advise kv | gpus | spec | disagg ...     one calculator
  ridgeline advise --validate                         predicted vs measured on this machine"""

SUBCOMMANDS = {
    "kv": "KV cache sizing: bytes per token, capacity, maximum concurrency by context",
    "gpus": "how many devices, and tensor / pipeline / expert parallel with the reason",
    "spec": "speculative decoding: expected accepted tokens and the gain by batch size (break-even)",
    "disagg": "does this traffic justify prefill/decode disaggregation, and which xPyD",
}


def _common(p: argparse.ArgumentParser, sub: bool) -> None:
    d = (lambda v: argparse.SUPPRESS) if sub else (lambda v: v)  # a subcommand keeps values given before it
    g = p.add_argument_group("model and hardware")
    g.add_argument("--model", default=d("smollm2-135m"),
                   help="config.json path, shipped name (e.g. Llama-3.1-70B), or a model Ridgeline loads")
    g.add_argument("--hardware", default=d("H100-SXM"), help="table name (e.g. H100, MI300X, L4) or 'local'")
    g.add_argument("--gpus", type=int, default=d(None), help="devices to use (default: the fewest that fit)")
    g.add_argument("--weights", default=d("bf16"), help="weight precision: fp32 bf16 fp16 fp8 int8 int4 fp4")
    g.add_argument("--kv", default=d("bf16"), help="KV cache precision")
    g.add_argument("--reprofile", action="store_true", default=d(False), help="re-measure --hardware local")
    w = p.add_argument_group("workload")
    w.add_argument("--prompt-len", type=int, default=d(1024))
    w.add_argument("--output-len", type=int, default=d(256))
    w.add_argument("--concurrency", type=int, default=d(16), help="requests decoding at once")
    w.add_argument("--rate", type=float, default=d(None), help="requests/s (overrides --concurrency)")
    w.add_argument("--prefix-share", type=float, default=d(0.0), help="f: shared fraction of each prompt")
    w.add_argument("--ttft-slo-ms", type=float, default=d(1000.0))
    w.add_argument("--tpot-slo-ms", type=float, default=d(50.0))
    t = p.add_argument_group("techniques")
    t.add_argument("--alpha", type=float, default=d(0.7), help="speculative acceptance rate per token")
    t.add_argument("--draft-len", type=int, default=d(4), help="speculative draft tokens k")
    t.add_argument("--draft-cost", type=float, default=d(0.05), help="draft step time / target step time")
    t.add_argument("--chunk", type=int, default=d(512), help="chunked-prefill tokens per step")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", default=d(False), help="print JSON instead of text")
    o.add_argument("--plot", default=d(None), metavar="PNG", help="draw the roofline with the workload's points")


def register(subparsers) -> None:
    p = subparsers.add_parser("advise", help="which wall you hit and which technique pays off (arithmetic shown)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, sub=False)
    v = p.add_argument_group("validation (runs the engine on this machine)")
    v.add_argument("--validate", action="store_true", help="predicted vs measured with the default model")
    v.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    v.add_argument("--kv-cache-memory", default="1GiB")
    v.add_argument("--batches", default="1,4,16,32,64", help="decode batch sizes to sweep")
    v.add_argument("--steps", type=int, default=8, help="timed decode steps per batch size")
    v.add_argument("--threads", type=int, default=None, help="torch threads for the profile and the engine")
    v.add_argument("--cpu-time", action="store_true", help="time with this process's CPU time (needs --threads 1)")
    sub = p.add_subparsers(dest="advise_command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, help_ in SUBCOMMANDS.items():
        _common(sub.add_parser(name, help=help_, description=help_), sub=True)
    p.set_defaults(func=run, advise_command=None)


def scenario_from_args(args):
    from ridgeline.advisor.errors import AdvisorError
    from ridgeline.advisor.hardware import lookup_hardware
    from ridgeline.advisor.model_config import resolve_spec
    from ridgeline.advisor.scenario import SpecDecode, build
    from ridgeline.advisor.workload import Workload

    spec = resolve_spec(args.model)
    if args.hardware.lower() == "local":
        from ridgeline.advisor.local_profile import local_hardware
        hw = local_hardware(refresh=args.reprofile)
    else:
        hw = lookup_hardware(args.hardware)
    if args.draft_len < 1 or not 0 <= args.alpha < 1 or args.draft_cost < 0:
        raise AdvisorError("speculative settings: need --draft-len >= 1, 0 <= --alpha < 1, --draft-cost >= 0")
    w = Workload(prompt_len=args.prompt_len, output_len=args.output_len, concurrency=args.concurrency,
                 rate=args.rate, prefix_share=args.prefix_share, ttft_slo=args.ttft_slo_ms / 1e3,
                 tpot_slo=args.tpot_slo_ms / 1e3, weight_precision=args.weights, kv_precision=args.kv)
    return build(spec, hw, w, gpus=args.gpus, sd=SpecDecode(args.alpha, args.draft_len, args.draft_cost),
                 chunk=args.chunk)


def run(args) -> int:
    if getattr(args, "validate", False):
        from ridgeline.advisor.validate import run_validate
        return run_validate(args)
    from ridgeline.advisor import calculators
    from ridgeline.advisor.report import as_json, full_report, render

    s = scenario_from_args(args)
    if args.advise_command:
        sections, wall, techniques = calculators.CALCULATORS[args.advise_command](s)
    else:
        sections, wall, techniques = full_report(s)
    if args.plot:
        from ridgeline.advisor.plot import plot_roofline
        plot_roofline(s, args.plot)
    if args.json:
        print(json.dumps(as_json(s, sections, wall, techniques), indent=1, default=str))
    else:
        print(render(sections, wall, techniques))
        if args.plot:
            print(f"\nwrote {args.plot}")
    return 0
