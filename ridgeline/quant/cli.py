"""`ridgeline quantize MODEL --method rtn|gptq|awq --out DIR`: registered by ridgeline/cli.py."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ridgeline.cli_parser import positive_int
from ridgeline.formats.options import INT4_GROUP_SIZES
from ridgeline.quant.choices import BITS, DEFAULT_TOKENS, METHODS


def register(subparsers, command: str | None = None) -> None:
    p = subparsers.add_parser(
        "quantize", help="write an int4 GPTQ / AWQ / round-to-nearest copy of a model folder",
        description="Quantize every decoder layer's projections to int4 and write a Hugging Face folder in "
                    "the hub's GPTQ layout (rtn, gptq) or AutoAWQ's GEMM layout (awq), with "
                    "quantization_config in config.json; the engine (and other GPTQ / AWQ loaders) read it "
                    "back as it is. gptq and awq fit to calibration text.")
    p.add_argument("model", metavar="MODEL", help="HF folder, .gguf file, hub id or built-in alias (unquantized)")
    p.add_argument("--method", choices=METHODS, default="gptq", help="how weights are rounded")
    p.add_argument("--bits", type=int, default=4, metavar="N", help=f"bits per weight (allowed: {BITS})")
    p.add_argument("--group-size", type=int, default=128, metavar="G",
                   help=f"input columns per scale (allowed: {', '.join(map(str, INT4_GROUP_SIZES))})")
    p.add_argument("--symmetric", action="store_true",
                   help="a scale per group, zero point 8 (default: asymmetric, an integer zero point per group)")
    p.add_argument("--act-order", action="store_true",
                   help="gptq: quantize columns by decreasing activation energy (writes g_idx; such layers run "
                        "on the module path, not the C decoder stack)")
    p.add_argument("--awq-duo", action="store_true",
                   help="awq: besides s = mean|x|^a, also score s = mean|x|^a / mean|w|^(1-a) (w relative to "
                        "its group's largest) for each group of projections and keep the better")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="UTF-8 text to fit gptq / awq to; 'none' for no text (rtn only) (default: the shipped "
                        "calibration part, World Factbook profiles, never the held-out part eval scores)")
    p.add_argument("--calibration-tokens", type=positive_int, default=DEFAULT_TOKENS, metavar="N",
                   help="calibration tokens used at most, in windows of 512")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write, new or empty (required, no default)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.set_defaults(func=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    from ridgeline.quant.quantize import QuantizeOptions, quantize_folder
    from ridgeline.models.resolve import resolve_model
    opts = QuantizeOptions(args.method, args.bits, args.group_size, args.symmetric, args.act_order,
                           args.calibration, args.calibration_tokens, awq_duo=args.awq_duo)
    opts.check()  # before the model is resolved or read
    src = resolve_model(args.model, progress=args.progress)
    qc = quantize_folder(src, Path(args.out), opts, progress=args.progress)
    print(f"wrote {args.out}: {qc['quant_method']} layout, method {qc['method']}, {qc['bits']} bits, groups of "
          f"{qc['group_size']}, {'symmetric' if qc['symmetric'] else 'asymmetric'}"
          + (f", calibration {qc['calibration']} ({qc['calibration_tokens']} tokens)" if qc["calibration"] else ""),
          file=sys.stderr)
    return 0
