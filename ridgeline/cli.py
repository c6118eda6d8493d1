"""ridgeline serve | generate | chat | bench | cache-report | pull"""
from __future__ import annotations

import argparse
import sys

from ridgeline.errors import RidgelineError


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m",
                   help="HF folder, .gguf file, hub id, or built-in alias (default: smollm2-135m)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--device", default="auto")
    g.add_argument("--kv-cache-memory", default=None, help="KV cache size, e.g. 2GiB (default: 25%% of free "
                                                           "memory, at most 4 GiB)")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="do not reuse KV blocks of identical prompt prefixes across requests")
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--seed", type=int, default=0)


def engine_kwargs(args: argparse.Namespace) -> dict:
    keys = ["dtype", "max_model_len", "device", "kv_cache_memory", "block_size", "enable_prefix_caching",
            "max_num_batched_tokens", "max_num_seqs", "seed"]
    return {k: getattr(args, k) for k in keys}


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--sampling-seed", type=int, default=None)


def sampling_params(args: argparse.Namespace):
    from ridgeline.sampling_params import SamplingParams
    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.sampling_seed)


def make_llm(args: argparse.Namespace):
    from ridgeline.entrypoints.llm import LLM
    llm = LLM(args.model, **engine_kwargs(args))
    print(llm.info.summary(), file=sys.stderr)
    return llm


def cmd_generate(args):
    llm = make_llm(args)
    params = sampling_params(args)
    if args.raw:
        outs = llm.generate(args.prompt, params, use_tqdm=False)
    else:
        outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params, use_tqdm=False)
    for out in outs:
        print(out.outputs[0].text)


def cmd_chat(args):
    from ridgeline.entrypoints.chat import interactive_chat
    interactive_chat(make_llm(args), sampling_params(args), system=args.system)


def cmd_pull(args):
    from ridgeline.weights.gguf_convert import ensure_converted
    from ridgeline.weights.pull import pull
    path = pull(args.alias)
    print(f"{args.alias}: {path}")
    print(f"converted: {ensure_converted(path)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ridgeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate a reply to each prompt (chat template applied)")
    p.add_argument("prompt", nargs="+")
    p.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive streaming chat")
    p.add_argument("--system", default=None)
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("pull", help="fetch a built-in model alias into the model cache")
    p.add_argument("alias", nargs="?", default="smollm2-135m")
    p.set_defaults(func=cmd_pull)

    for register in _plugins():
        register(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except RidgelineError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _plugins():
    """Subcommands that live beside their packages (bench, serve, ...), registered if present."""
    import importlib
    for mod in ("ridgeline.bench.cli", "ridgeline.serve.cli", "ridgeline.cache_report.cli", "ridgeline.advisor.cli"):
        try:
            yield importlib.import_module(mod).register
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


if __name__ == "__main__":
    sys.exit(main())
