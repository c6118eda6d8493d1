"""`ridgeline bench ...`: registered by ridgeline/cli.py when this module exists."""
from __future__ import annotations

HELP = ("benchmarks: throughput and decode vs HF transformers, serve (online), speculative decoding, structured "
        "outputs, the quantization ladder, long context, random-weight models")


def register(subparsers, command: str | None = None) -> None:
    """command: the subcommand being run; for another one (or none: `ridgeline --help`), `bench` is a stub
    with its help line, so its modules (torch among their imports) are not loaded."""
    from ridgeline.advisor.cli import VALIDATORS
    from ridgeline.bench.spec_validate import add_spec_validate_args, run_spec_validate

    VALIDATORS["spec"] = (add_spec_validate_args, run_spec_validate)  # `advise spec --validate` measures here
    if command is not None and command != "bench":
        subparsers.add_parser("bench", help=HELP)
        return
    from ridgeline.bench.decode import add_decode_parser
    from ridgeline.bench.quant import add_quant_parser
    from ridgeline.bench.long_context_cli import add_long_context_parser
    from ridgeline.bench.random_model import add_random_model_parser
    from ridgeline.bench.serve import add_serve_parser
    from ridgeline.bench.spec import add_spec_parser
    from ridgeline.bench.structured import add_structured_parser
    from ridgeline.bench.throughput import add_throughput_parser
    from ridgeline.engine.args import add_engine_args

    p = subparsers.add_parser("bench", help=HELP,
                              description="Benchmarks: Ridgeline and HF transformers on the same model, "
                                          "dtype and prompts, in one process (throughput, decode); an "
                                          "OpenAI-compatible server under load (serve); speculative "
                                          "decoding against none (spec); a structured-output constraint's "
                                          "cost and compile times (structured); every quantization's bytes, "
                                          "speeds and quality (quant); speed by context length "
                                          "(long-context); random-weight models with a published "
                                          "model's structure (random-model); the size ladder at 1B-8B "
                                          "against this machine's ceilings and llama.cpp (scale); LoRA "
                                          "adapters against the base model (lora).")
    bsub = p.add_subparsers(dest="bench_command", required=True,
                            metavar="{throughput,decode,serve,spec,structured,quant,long-context,random-model,"
                                    "scale,lora,routing,disagg}")
    for add in (add_throughput_parser, add_decode_parser, add_serve_parser, add_spec_parser, add_structured_parser,
                add_quant_parser, add_long_context_parser):
        add_engine_args(add(bsub))
    add_random_model_parser(bsub)
    from ridgeline.bench.kv_groups import add_kv_groups_parser
    add_kv_groups_parser(bsub)
    from ridgeline.bench.models_front import add_models_parser
    add_models_parser(bsub)
    from ridgeline.bench.scale import add_scale_parser
    add_scale_parser(bsub)
    from ridgeline.bench.lora import add_lora_parser
    add_engine_args(add_lora_parser(bsub))
    from ridgeline.bench.routing import add_routing_parser
    add_routing_parser(bsub)
    from ridgeline.bench.disagg_cli import add_disagg_parser
    add_disagg_parser(bsub)
    p.set_defaults(func=lambda args: p.print_help())

