"""`ridgeline advise [kv|gpus|spec|disagg|quant]`: registered by ridgeline/cli.py."""
from __future__ import annotations

import argparse
import json
import math

from ridgeline.cli_parser import output_file, positive_int

DESCRIPTION = """Diagnose the binding wall (capacity, bandwidth, compute, network, SLO contention) of a model on
hardware under a workload, and rank the techniques that pay off, with the arithmetic shown.
  ridgeline advise --model Llama-3.1-70B --hardware H100 --prompt-len 2000 --concurrency 64
  ridgeline advise kv | gpus | spec | disagg | quant ...   one calculator
  ridgeline advise --validate                         predicted vs measured on this machine
  ridgeline advise spec --validate --draft-len 2      speculative gain by batch size, predicted vs measured"""

SUBCOMMANDS = {
    "kv": "KV cache sizing: bytes per token, capacity, maximum concurrency by context",
    "gpus": "how many devices, and tensor / pipeline / expert parallel with the reason",
    "spec": "speculative decoding: expected accepted tokens and the gain by batch size (break-even)",
    "disagg": "does this traffic justify prefill/decode disaggregation, and which xPyD",
    "quant": "weight formats: memory, predicted decode speed, and measured quality on the default model",
}


# `advise CALC --validate` for calculators whose check runs the engine, registered by the package that
# measures (bench/spec_validate.py: `spec`) before this parser is built: CALC -> (add_args(subparser)
# adding a --validate with dest calc_validate, run(args) -> exit code). The advisor runs no engine for them.
VALIDATORS: dict[str, tuple] = {}


def _common(p: argparse.ArgumentParser, sub: bool) -> None:
    def add(group, flag: str, default, text: str, **kw) -> None:
        if sub:  # a subcommand keeps the values given before it: its own defaults are only shown
            shown = "" if default is None or kw.get("action") == "store_true" else f" (default: {default})"
            text, default = text + shown, argparse.SUPPRESS
        group.add_argument(flag, default=default, help=text, **kw)

    g = p.add_argument_group("model and hardware")
    add(g, "--model", "smollm2-135m", "config.json path, shipped name (e.g. Llama-3.1-70B), or a model Ridgeline loads")
    add(g, "--hardware", "auto", "table name (e.g. H100, MI300X, L4), 'local' (this machine, measured once and "
        "cached), or 'auto': the visible GPU's table entry, else local")
    add(g, "--gpus", None, "devices to use (default: the fewest that fit)", type=int, metavar="N")
    add(g, "--pipeline-parallel-size", None, "plan this many pipeline stages (default: the advisor chooses the "
        "layout)", type=int, metavar="N")
    add(g, "--weights", "auto", "weight precision: fp32 bf16 fp16 fp8 int8 int4 fp4, or 'auto': what the engine "
        "runs the model in (a GGUF's blocks as stored, a quantized folder's format, else bf16)")
    add(g, "--kv", "bf16", "KV cache precision")
    add(g, "--reprofile", False, "re-measure --hardware local", action="store_true")
    w = p.add_argument_group("workload")
    add(w, "--prompt-len", 1024, "prompt tokens per request", type=int, metavar="N")
    add(w, "--output-len", 256, "output tokens per request", type=int, metavar="N")
    add(w, "--concurrency", 16, "requests decoding at once", type=int, metavar="N")
    add(w, "--rate", None, "requests/s, overrides --concurrency (default: none)", type=float)
    add(w, "--prefix-share", 0.0, "f: shared fraction of each prompt", type=float, metavar="F")
    add(w, "--ttft-slo-ms", 1000.0, "time-to-first-token target in ms", type=float, metavar="MS")
    add(w, "--tpot-slo-ms", 50.0, "time-per-output-token target in ms", type=float, metavar="MS")
    t = p.add_argument_group("techniques")
    add(t, "--alpha", 0.7, "speculative acceptance rate per token", type=float)
    add(t, "--draft-len", 4, "speculative draft tokens k", type=int, metavar="K")
    add(t, "--draft-cost", 0.05, "draft step time / target step time", type=float, metavar="C")
    add(t, "--chunk", 512, "chunked-prefill tokens per step", type=int, metavar="N")
    o = p.add_argument_group("output")
    add(o, "--json", False, "print JSON instead of text", action="store_true")
    add(o, "--plot", None, "draw the roofline with the workload's points to PNG (default: none)", metavar="PNG",
        type=output_file)


def register(subparsers, command: str | None = None) -> None:
    p = subparsers.add_parser("advise", help="which wall you hit and which technique pays off (arithmetic shown)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, sub=False)
    v = p.add_argument_group("validation (runs the engine on this machine)")
    v.add_argument("--validate", action="store_true", help="predicted vs measured with the default model")
    v.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="engine dtype")
    v.add_argument("--kv-cache-memory", default="1GiB", metavar="SIZE", help="engine KV cache size")
    v.add_argument("--batches", default="1,4,16,32,64", metavar="B,B,...", help="decode batch sizes to sweep")
    v.add_argument("--steps", type=positive_int, default=8, metavar="N", help="timed decode steps per batch size")
    v.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch threads for the profile and the engine (default: torch's own)")
    v.add_argument("--cpu-time", action="store_true", help="time with this process's CPU time (needs --threads 1)")
    v.add_argument("--tensor-parallel-size", type=positive_int, default=1, metavar="N",
                   help="with N > 1: predicted vs measured communication time per step of the engine split over "
                        "N ranks (the link measured first)")
    sub = p.add_subparsers(dest="advise_command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, help_ in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        _common(sp, sub=True)
        if name == "disagg":
            from ridgeline.advisor.disagg_advice import add_disagg_args
            add_disagg_args(sp)
        if name in VALIDATORS:
            VALIDATORS[name][0](sp)
    p.set_defaults(func=run, advise_command=None)


def scenario_from_args(args, spec=None, local=None):
    """spec: the model's, when the caller has it already (the console's served model); else args.model's.
    local: () -> this machine's Hardware (the console's: the cached profile or an error); else measured once
    and cached."""
    from ridgeline.advisor.errors import AdvisorError, require_positive
    from ridgeline.advisor.hardware import lookup_hardware
    from ridgeline.advisor.model_config import resolve_spec
    from ridgeline.advisor.scenario import SpecDecode, build
    from ridgeline.advisor.workload import Workload
    from ridgeline.advisor.defaults import hardware_name, weights_for

    spec = spec or resolve_spec(args.model)
    weights = weights_for(args.weights, args.model, spec.num_params)
    require_positive("--ttft-slo-ms", args.ttft_slo_ms)
    require_positive("--tpot-slo-ms", args.tpot_slo_ms)
    if args.draft_len < 1 or not 0 <= args.alpha < 1 or not 0 <= args.draft_cost < math.inf:
        raise AdvisorError("speculative settings: need --draft-len >= 1, 0 <= --alpha < 1, finite --draft-cost >= 0")
    w = Workload(prompt_len=args.prompt_len, output_len=args.output_len, concurrency=args.concurrency,
                 rate=args.rate, prefix_share=args.prefix_share, ttft_slo=args.ttft_slo_ms / 1e3,
                 tpot_slo=args.tpot_slo_ms / 1e3, weight_precision=weights, kv_precision=args.kv)
    w.check_fits(spec.max_context, spec.name)
    name = hardware_name(args.hardware)  # after the workload's checks: bad input never waits for a profile
    if name.lower() == "local" and local is not None:
        hw = local()
    elif name.lower() == "local":
        from ridgeline.advisor.local_profile import local_hardware
        hw = local_hardware(refresh=args.reprofile)
    else:
        hw = lookup_hardware(name)
    return build(spec, hw, w, gpus=args.gpus, sd=SpecDecode(args.alpha, args.draft_len, args.draft_cost),
                 chunk=args.chunk, pp=getattr(args, "pipeline_parallel_size", None))


def run(args) -> int:
    if args.advise_command in VALIDATORS and getattr(args, "calc_validate", False):
        return VALIDATORS[args.advise_command][1](args)
    if getattr(args, "validate", False) and getattr(args, "tensor_parallel_size", 1) > 1:
        from ridgeline.advisor.validate_tp import run_tp_validate
        return run_tp_validate(args)
    if getattr(args, "validate", False):
        from ridgeline.advisor.validate import run_validate
        return run_validate(args)
    from ridgeline.advisor import calculators
    from ridgeline.advisor.report import as_json, full_report, render

    s = scenario_from_args(args)
    if args.advise_command == "disagg" and (args.simulate or args.disagg_validate):
        from ridgeline.advisor.disagg_advice import run_disagg_extra
        return run_disagg_extra(args, s)
    if args.advise_command:
        sections, wall, techniques = calculators.CALCULATORS[args.advise_command](s)
    else:
        sections, wall, techniques = full_report(s)
    if args.plot:
        from ridgeline.advisor.plot import plot_roofline
        plot_roofline(s, args.plot)
    if args.json:
        print(json.dumps(as_json(s, sections, wall, techniques), indent=1, default=str, allow_nan=False))
    else:
        print(render(sections, wall, techniques))
        if args.plot:
            print(f"\nwrote {args.plot}")
    return 0
