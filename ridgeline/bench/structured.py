"""`ridgeline bench structured`: what a structured-output constraint costs, measured in one run.

For each schema workload (structured-permissive: long free strings; structured-restrictive: enums,
bounded numbers, booleans; structured: the corpus) and batch size, the same prompts run greedy with
speculation off, unconstrained and constrained, each request emitting as many tokens unconstrained
as it did constrained (so the batch shrinks the same way in both), alternating within each repeat (the order rotates
between repeats); the ratio is the median of each repeat's constrained / unconstrained decode tok/s.
A third arm runs constrained with the whole LM head computed (the masked head off): the head gain is
constrained / that, and its tokens are checked equal.
Beside it: the step thread's mask time per step, how many outputs completed (finish_reason stop; the
rest reached --output-len), how many validate (JSON Schema, where `jsonschema` is installed) and the
share of tokens the grammar forced. Then the compile: every corpus schema compiled on a fresh
backend (median, slowest), and pathological inputs (exponential regexes, a schema nested thousands
deep, 20,000-value enums, a schema over the size limit): the time to compile or to be refused, and
for those that compile, the slowest mask of the first steps."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ridgeline.bench.spec import _ints
from ridgeline.bench.spec_runs import Run, Setting, timed_runs
from ridgeline.bench.structured_workload import corpus_schemas, forced_share, structured_workload
from ridgeline.bench.throughput import dtype_name
from ridgeline.cli_parser import output_file, positive_int
from ridgeline.errors import InvalidRequestError
from ridgeline.measure.record import write_json
from ridgeline.structured_params import StructuredOutputs

OFF = Setting("off", 0)
DRAFT_K = 4  # --grammar-drafts: at most this many per step, the controller choosing
ARMS = ["free", "constrained", "full head"]  # unconstrained; constrained; constrained with the whole LM head


def _workloads(text: str) -> list[str]:
    from ridgeline.bench.structured_workload import WORKLOADS
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or 'none'}: choose from {', '.join(WORKLOADS)}")
    return names


def _validator(schema: dict):
    try:
        from jsonschema import Draft202012Validator, FormatChecker
    except ImportError:
        return None
    return Draft202012Validator(schema, format_checker=FormatChecker())


def _valid(prompts, outputs: list[list[int]], tokenizer, output_len: int) -> tuple[int, int]:
    """(complete outputs that parse and validate against their schema, complete outputs checked); (0, 0)
    without jsonschema. An output of output_len tokens was cut by max_tokens: a valid prefix, not checked."""
    good = checked = 0
    for p, toks in zip(prompts, outputs):
        if len(toks) >= output_len:
            continue
        text = tokenizer.decode(toks, skip_special_tokens=True)
        if p.tools is not None:  # one call of one of the tools, its arguments valid against its schema
            checked += 1
            good += _valid_call(text, p.tools)
            continue
        v = _validator(json.loads(p.structured.json)) if p.structured.json else None
        if v is None:
            continue
        checked += 1
        try:
            good += v.is_valid(json.loads(text))
        except ValueError:
            pass
    return good, checked


def _valid_call(text: str, tools: list[dict]) -> bool:
    from ridgeline.tool_calls.formats import GENERIC
    from ridgeline.tool_calls.parser import ToolCallParser, parse_all
    _, calls = parse_all(ToolCallParser(GENERIC), [], text)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if len(calls) != 1 or calls[0].name not in schemas:
        return False
    v = _validator(schemas[calls[0].name])
    return v is None or v.is_valid(json.loads(calls[0].arguments))


def cost_rows(args: argparse.Namespace, eng) -> list[dict]:
    rows = []
    tok = eng.tokenizer
    for workload in args.workloads:
        n = max(args.batch_sizes + [args.requests])
        constrained = structured_workload(workload, tok, n, seed=args.workload_seed)
        # the unconstrained arm emits as many tokens per request as the constrained one (greedy: the same
        # every repeat), so both run the same batch sizes step for step
        setting = Setting("grammar", DRAFT_K, True) if args.grammar_drafts else OFF
        lengths = timed_runs(eng, constrained, max(args.batch_sizes), setting, args.output_len, True).outputs
        free = [p.unconstrained(len(o)) for p, o in zip(constrained, lengths)]
        timed_runs(eng, free[:2], 2, setting, 16, True)  # warm-up
        for B in args.batch_sizes:
            P = max(B, args.requests)
            runs: dict[str, list[Run]] = {arm: [] for arm in ARMS}
            mask = []
            model = eng.runner.model
            for rep in range(args.repeats):
                for arm in ARMS[rep % len(ARMS):] + ARMS[:rep % len(ARMS)]:
                    before = eng.structured.stats
                    model.masked_head = arm != "full head"
                    r = timed_runs(eng, (free if arm == "free" else constrained)[:P], B, setting, args.output_len,
                                   True)
                    model.masked_head = True
                    runs[arm].append(r)
                    if arm == "constrained":
                        after = eng.structured.stats
                        steps = after.mask_steps - before.mask_steps
                        mask.append((after.mask_seconds - before.mask_seconds) / steps if steps else 0.0)
            last = runs["constrained"][-1]
            shares = forced_share(eng.structured.backend, constrained[:P], last.outputs)
            forced, total = sum(f for f, _ in shares.values()), sum(t for _, t in shares.values())
            good, checked = _valid(constrained[:P], last.outputs, tok, args.output_len)
            row = {"workload": workload, "batch": B,
                   "free_decode_tok_s": statistics.median(r.decode_tok_s for r in runs["free"]),
                   "constrained_decode_tok_s": statistics.median(r.decode_tok_s for r in runs["constrained"]),
                   "full_head_decode_tok_s": statistics.median(r.decode_tok_s for r in runs["full head"]),
                   "ratio": statistics.median(c.decode_tok_s / f.decode_tok_s
                                              for c, f in zip(runs["constrained"], runs["free"])),
                   "masked_head_gain": statistics.median(c.decode_tok_s / f.decode_tok_s
                                                         for c, f in zip(runs["constrained"], runs["full head"])),
                   "same_tokens_full_head": runs["constrained"][-1].outputs == runs["full head"][-1].outputs,
                   "mask_ms_per_step": 1000 * statistics.median(mask),
                   "completed": sum(len(o) < args.output_len for o in last.outputs), "requests": P,
                   "valid": good, "validated": checked, "forced_share": forced / total if total else 0.0}
            rows.append(row)
            print(f"{workload:<24}{B:>6}{row['free_decode_tok_s']:>10.1f}{row['constrained_decode_tok_s']:>13.1f}"
                  f"{row['ratio']:>8.3f}x{row['masked_head_gain']:>11.3f}x{row['mask_ms_per_step']:>9.3f}"
                  f"{row['completed']:>6}/{P:<4}{good:>6}/{checked:<4}{row['forced_share']:>8.2f}"
                  f"  {'yes' if row['same_tokens_full_head'] else 'NO'}", flush=True)
    return rows


def _deep(n: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(n):
        s = {"type": "array", "items": s, "maxItems": 2}
    return s


PATHOLOGICAL = {
    "exponential regex (a|b)*a(a|b){30}": {"regex": "(a|b)*a(a|b){30}"},
    "nested quantifiers ((a+)+)+b": {"regex": "((a+)+)+b(c|d){20}x"},
    "schema nested 100 deep": {"json": _deep(100)},
    "schema nested 3000 deep": {"json": _deep(3000)},
    "enum of 20,000 values": {"json": {"enum": [f"value{i}" for i in range(20000)]}},
    "schema over 256 KiB (1 MB)": {"json": {"type": "object", "properties": {
        f"k{i}": {"type": "string", "maxLength": 5} for i in range(40000)}}},
}


def compile_rows(eng) -> dict:
    """Corpus compile times on a fresh backend, then each pathological input's fate and time."""
    from ridgeline.engine.constraint import create_backend
    backend = create_backend(eng.tokenizer, eng.arch.vocab_size, sorted(eng.eos_ids))
    t0 = time.perf_counter()
    backend.load()
    table_s = time.perf_counter() - t0
    times = {}
    for name, schema in corpus_schemas().items():
        t0 = time.perf_counter()
        backend.prepare(StructuredOutputs(json=schema))
        times[name] = time.perf_counter() - t0
    med, worst = statistics.median(times.values()), max(times, key=times.get)
    print(f"\ncompile: token table {1000 * table_s:.0f} ms (once per engine); corpus of {len(times)} schemas: "
          f"median {1000 * med:.2f} ms, slowest {1000 * times[worst]:.2f} ms ({worst})")
    patho = []
    for label, kw in PATHOLOGICAL.items():
        t0 = time.perf_counter()
        try:
            c = backend.create(StructuredOutputs(**kw))
            fate = "compiles"
        except InvalidRequestError as e:
            c, fate = None, "refused: " + e.message[:90]
        elapsed = time.perf_counter() - t0
        worst_mask = 0.0
        if c is not None:  # its first masks, walking the first allowed token each time
            for _ in range(16):
                t1 = time.perf_counter()
                m = c.allowed_mask()
                worst_mask = max(worst_mask, time.perf_counter() - t1)
                bits = int.from_bytes(m, "little")
                if not bits or c.is_done:
                    break
                c.advance((bits & -bits).bit_length() - 1)
        patho.append({"input": label, "fate": fate, "seconds": elapsed, "worst_mask_s": worst_mask})
        print(f"  {label:<36}{1000 * elapsed:>8.0f} ms  {fate}"
              + (f"; slowest of its first masks {1000 * worst_mask:.2f} ms" if c is not None else ""))
    return {"token_table_s": table_s, "corpus_median_s": med, "corpus_max_s": times[worst], "corpus_slowest": worst,
            "pathological": patho}


def cmd_structured(args: argparse.Namespace) -> int:
    from ridgeline.engine.args import engine_kwargs
    from ridgeline.engine.run import start_engine
    from ridgeline.measure.record import describe_machine, machine_info
    wall0 = time.perf_counter()
    machine = machine_info()
    print(describe_machine(machine), file=sys.stderr)
    kw = engine_kwargs(args)
    kw.update(speculative_method="grammar" if args.grammar_drafts else None, draft_model=None,
              speculative_layers=None, num_speculative_tokens=DRAFT_K)
    eng = start_engine(args.model, **kw)
    print(eng.info.summary(), file=sys.stderr)
    print(f"\nStructured outputs: {args.model} ({dtype_name(eng.info.dtype)}) on {machine['cpu']}, "
          f"{machine['torch_threads']} threads; greedy, {'grammar drafts' if args.grammar_drafts else 'speculation off'}, up to {args.output_len} tokens per request, "
          f"median of {args.repeats}; ratio: constrained / unconstrained decode tok/s, same prompts, same run; "
          f"head gain: constrained with the masked LM head / with the whole head; same: their tokens equal")
    head = (f"{'workload':<24}{'batch':>6}{'free':>10}{'constrained':>13}{'ratio':>9}{'head gain':>12}{'mask ms':>9}"
            f"{'complete':>11}{'valid':>11}{'forced':>8}  same")
    print(head + "\n" + "-" * len(head))
    rows = cost_rows(args, eng)
    compiled = compile_rows(eng)
    wall = time.perf_counter() - wall0
    print(f"bench wall time {wall:.0f}s")
    if args.json:
        write_json(args.json, {"command": "structured", "machine": machine, "model": args.model,
                               "dtype": dtype_name(eng.info.dtype), "output_len": args.output_len,
                               "repeats": args.repeats, "rows": rows, "compile": compiled, "wall_s": wall})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_structured_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("structured", help="structured outputs: a constraint's cost per token, compile times",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", type=_workloads, default=["structured-permissive", "structured-restrictive"],
                   metavar="W[,W...]", help="structured-permissive, structured-restrictive, structured, "
                                            "structured-unbounded, tools (tool calls, tool_choice required)")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 16], metavar="B[,B...]", help="requests decoding together")
    p.add_argument("--output-len", type=positive_int, default=128, metavar="N", help="most tokens per request")
    p.add_argument("--requests", type=positive_int, default=4, metavar="N",
                   help="requests per run at least (a batch size below N runs them B at a time)")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="runs of each side")
    p.add_argument("--workload-seed", type=int, default=0, metavar="N", help="seed of the workloads' prompts")
    p.add_argument("--grammar-drafts", action="store_true",
                   help="run the engine with grammar drafts (--speculative-method grammar, the goodput controller "
                        "choosing k): both arms, the unconstrained one drafting nothing")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the rows to FILE (default: none)")
    p.set_defaults(func=cmd_structured)
    return p
