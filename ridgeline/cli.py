"""ridgeline serve | generate | chat | pull | bench | eval | quantize | train-draft | advise | router | cache-report"""
from __future__ import annotations

import argparse
import os
import sys

from ridgeline.version import __version__
from ridgeline.cli_parser import RidgelineParser
from ridgeline.errors import RidgelineError
from ridgeline.engine.args import add_engine_args, engine_kwargs

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for `yes | head`, so pipefail scripts see the same


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=256, metavar="N", help="most tokens generated per reply")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 is greedy: the same reply every time")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample from the most likely tokens whose probabilities add up to this; 1 keeps all")
    g.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="sample from the k most likely tokens; 0 keeps all")
    g.add_argument("--sampling-seed", type=int, default=None, metavar="N",
                   help="makes sampling at temperature > 0 repeatable (default: none, a new draw each run)")


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
    from ridgeline.entrypoints.stream import stream_replies
    params = sampling_params(args)  # before loading: a bad value fails in a second, not after the load
    llm = make_llm(args)
    engine, tok = llm.engine, llm.tokenizer
    ids = []
    try:
        for i, prompt in enumerate(args.prompt):
            ids.append(f"generate-{i}")
            if args.raw:
                engine.add_request(ids[-1], prompt, params)
            else:
                engine.add_request(ids[-1], tok.encode_chat([{"role": "user", "content": prompt}]), params, prompt)
    except RidgelineError:
        for rid in ids:
            engine.abort_request(rid)
        raise
    stream_replies(engine, ids)


def cmd_chat(args):
    from ridgeline.entrypoints.chat import interactive_chat
    params = sampling_params(args)
    interactive_chat(make_llm(args), params, system=args.system)


def cmd_pull(args):
    from ridgeline.gguf.convert import ensure_converted
    from ridgeline.weights.hub_pull import is_hub_spec, pull_hub
    from ridgeline.weights.pull import pull
    if is_hub_spec(args.alias):  # org/repo...: never an alias
        path = pull_hub(args.alias)
        print(f"{args.alias}: {path}")
        if path.suffix != ".gguf":
            return
    else:
        path = pull(args.alias)
        print(f"{args.alias}: {path}")
    print(f"converted: {ensure_converted(path, weights=args.with_weights)}")


def cmd_list(args):
    from ridgeline.weights.model_list import cached_models, table
    print(table(cached_models()))


def cmd_rm(args):
    from ridgeline.weights.model_list import remove
    for path in remove(args.name, force=args.force):
        print(f"removed {path}")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """command: the subcommand about to run (main passes argv's; "" for none, as `--version` and `--help`);
    a plugin whose parser costs imports to build (bench) builds only a stub for any other. None: every
    parser whole (the reference pages, the tests)."""
    parser = RidgelineParser(prog="ridgeline", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate a reply to each prompt, streamed (chat template applied)")
    p.add_argument("prompt", nargs="+", help="one or more prompts, each answered in turn (all run as one batch)")
    p.add_argument("--raw", action="store_true", help="complete the text as is, without the chat template")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive streaming chat (/help inside lists its commands)")
    p.add_argument("--system", default=None,
                   help="system message that opens the conversation (default: the chat template's own, if any)")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("pull", help="fetch a built-in model alias, or a model from the Hugging Face hub, into the cache")
    p.add_argument("alias", nargs="?", default="smollm2-135m",
                   help="a built-in alias; or a hub id: org/repo (an HF folder), org/repo:Q4_K_M (the repo's GGUF file "
                        "of that quantization), org/repo:FILE.gguf")
    p.add_argument("--with-weights", action="store_true",
                   help="also write the converted folder's float32 weights (model.safetensors), for tools that read "
                        "an HF folder such as transformers; Ridgeline itself reads the GGUF in place")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("list", help="the models in the cache: pulled aliases and converted GGUF folders")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("rm", help="remove a cached model (a pulled alias and its converted folders)")
    p.add_argument("name", help="an alias, or a GGUF file name as `ridgeline list` shows it")
    p.add_argument("--force", action="store_true",
                   help="remove it even while a running process (serve, generate, chat) holds it")
    p.set_defaults(func=cmd_rm)

    for register in _plugins():
        register(sub, command)
    apply_brief(parser)
    return parser


# What `--help` shows (every option: `--help-all`). Engine and parallelism flags, which every command that loads
# a model takes, are cut to ENGINE_BRIEF; a command's own options are all shown, except where BRIEF names them.
ENGINE_BRIEF = frozenset({"model", "dtype", "device", "max_model_len", "kv_cache_memory", "kv_cache_dtype",
                          "quantization", "speculative_method", "tensor_parallel_size"})
BRIEF = {
    ("serve",): ENGINE_BRIEF | {"host", "port", "api_key", "served_model_name", "draft_model", "max_num_seqs",
                                "data_parallel_size", "disaggregate", "log_requests"},
    ("bench", "serve"): ENGINE_BRIEF | {"url", "workload", "num_requests", "output_len", "concurrency",
                                        "request_rate", "json", "plot"},
    ("bench", "throughput"): ENGINE_BRIEF | {"workload", "num_requests", "output_len", "baseline", "json"},
}


def apply_brief(parser: argparse.ArgumentParser) -> None:
    for path, p in _walk(parser):
        dests = {a.dest for a in p._actions if a.option_strings}
        engine = {a.dest for g in p._action_groups if g.title in ("engine", "parallelism") for a in g._group_actions}
        brief = BRIEF.get(path, (dests - engine) | ENGINE_BRIEF)
        if isinstance(p, RidgelineParser) and dests - brief - {"help", "help_all", "version"}:
            p.brief = frozenset(brief)


def _walk(parser: argparse.ArgumentParser, path: tuple = ()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(next((a for a in argv if not a.startswith("-")), "")).parse_args(argv)
        rc = args.func(args) or 0
        sys.stdout.flush()  # a reader that went away shows up here, not in the interpreter's exit
        return rc
    except RidgelineError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ridgeline ... | head`: the reader has all it wanted
        _discard_stdout()
        return EXIT_BROKEN_PIPE


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of what is left does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):  # stdout is not a file (captured in tests)
        pass


def _plugins():
    """Subcommands that live beside their packages (bench, serve, ...), registered if present."""
    import importlib
    for mod in ("ridgeline.bench.cli", "ridgeline.serve.cli", "ridgeline.cache_report.cli", "ridgeline.advisor.cli",
                "ridgeline.eval.cli", "ridgeline.quant.cli", "ridgeline.speculative.cli",
                "ridgeline.router.cli"):
        try:
            yield importlib.import_module(mod).register
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


if __name__ == "__main__":
    sys.exit(main())
