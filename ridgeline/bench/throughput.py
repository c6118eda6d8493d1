"""`ridgeline bench throughput`: offline throughput on a fixed-seed workload, against HF transformers.

Ridgeline runs the whole workload through the engine to completion (the loop behind LLM.generate();
greedy, fixed output length, ignore_eos) after a warm-up on different prompts; then, in the same
process, on the same model folder, dtype and token ids: HF one request at a time and HF left-padded
batches. The table reports output tok/s, total (prompt + output) tok/s and useful GFLOP/s (2 * params
per processed token / time).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

from ridgeline.bench import hf_baseline, moe_report, pp_report, tp_report
from ridgeline.bench.report import RunResult, ratio_lines, throughput_table
from ridgeline.bench.workloads import make_workload
from ridgeline.cli_parser import non_negative_int, output_file, positive_int
from ridgeline.errors import InvalidRequestError
from ridgeline.measure.record import describe_machine, machine_info, write_json


def dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def build_engine(args: argparse.Namespace):
    from ridgeline.engine.args import engine_kwargs
    from ridgeline.engine.run import start_engine
    engine = start_engine(args.model, **engine_kwargs(args))
    print(engine.info.summary(), file=sys.stderr)
    return engine


def start(args: argparse.Namespace) -> tuple[float, dict, object]:
    """What every offline bench does first: note the wall clock, describe the machine, build the engine."""
    wall0 = time.perf_counter()
    machine = machine_info()
    print(describe_machine(machine), file=sys.stderr)
    return wall0, machine, build_engine(args)


def workload_from_args(args: argparse.Namespace, tokenizer, num_requests: int, seed: int) -> list[list[int]]:
    return make_workload(args.workload, tokenizer, num_requests, min_len=args.min_prompt,
                         max_len=args.max_prompt, prefix_len=args.prefix_len, seed=seed,
                         conversations=args.conversations, turns=args.turns)


def run_ridgeline(engine, prompts: list[list[int]], output_len: int, warmup_prompts: list[list[int]] | None = None,
                  progress: bool = True) -> tuple[RunResult, list[list[int]]]:
    from ridgeline.engine.run import run_to_completion
    from ridgeline.sampling_params import SamplingParams
    if warmup_prompts:
        run_to_completion(engine, warmup_prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    engine.reset_kv_usage()
    moe_report.reset(engine.runner.model)
    pp_link = pp_report.reset(engine)  # its link probe before the CPU-time counter starts
    cpu0 = tp_report.reset(engine)
    t0 = time.perf_counter()
    outs = run_to_completion(engine, prompts, params, use_tqdm=progress)
    elapsed = time.perf_counter() - t0
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    cached = sum(o.num_cached_tokens or 0 for o in outs)
    res = RunResult("Ridgeline", len(prompts), sum(map(len, prompts)), sum(map(len, tokens)), elapsed,
                    total_requests=len(prompts), extra={"cached_prompt_tokens": cached,
                                                        "kv_waste": engine.kv_waste(),
                                                        "preemptions": engine.scheduler.num_preemptions})
    short = sum(len(t) < output_len for t in tokens)
    notes = [f"KV slots allocated but empty: {100 * res.extra['kv_waste']:.1f}% (mean over steps)"]
    if cached:
        notes.append(f"{cached} prompt tokens served from the prefix cache")
    if short:
        notes.append(f"{short} requests stopped before {output_len} tokens (max_model_len?)")
    res.note = "; ".join(notes)
    res.extra["moe"] = moe_report.collect(engine.runner.model, elapsed)
    res.extra["tensor_parallel"] = tp_report.collect(engine, cpu0, elapsed, sum(map(len, prompts)),
                                                     sum(map(len, tokens)))
    res.extra["pipeline_parallel"] = pp_report.collect(engine, pp_link, elapsed)
    return res, tokens


def greedy_agreement(ours: list[list[int]], theirs: dict[int, list[int]], eos_ids: set[int]) -> dict:
    """How far greedy outputs agree, compared up to the first EOS in ours (HF masks EOS, we pass it)."""
    prefixes, exact = [], 0
    for i, t in theirs.items():
        o = ours[i]
        cut = next((j for j, tok in enumerate(o) if tok in eos_ids), len(o))
        o, t = o[:cut], t[:cut]
        n = next((j for j, (a, b) in enumerate(zip(o, t)) if a != b), min(len(o), len(t)))
        prefixes.append(n / max(1, len(o)))
        exact += n == len(o)
    return {"requests": len(prefixes), "identical": exact,
            "mean_matching_prefix": statistics.mean(prefixes) if prefixes else float("nan")}


def check_workload_args(args: argparse.Namespace) -> None:
    """What argparse cannot see flag by flag; checked before the model loads."""
    if args.min_prompt > args.max_prompt:
        raise InvalidRequestError(f"--min-prompt {args.min_prompt} is over --max-prompt {args.max_prompt}")


def cmd_throughput(args: argparse.Namespace) -> int:
    check_workload_args(args)
    wall0, machine, engine = start(args)
    skipped = hf_baseline.unavailable(args.baseline == "hf" and bool(args.hf_requests or args.hf_batch), machine)
    if skipped:
        print(f"baseline   {skipped}", file=sys.stderr)
    arch, info = engine.arch, engine.info
    num_params = arch.active_params  # FLOPs per token: a sparse model runs top_k of its experts
    prompts = workload_from_args(args, engine.tokenizer, args.num_requests, args.workload_seed)
    warm = workload_from_args(args, engine.tokenizer, min(8, args.num_requests), args.workload_seed + 10_000)
    lens = [len(p) for p in prompts]
    print(f"workload   {args.workload}, seed {args.workload_seed}: {len(prompts)} requests, prompts "
          f"{min(lens)}-{max(lens)} tokens (mean {statistics.mean(lens):.0f}, total {sum(lens)}), "
          f"{args.output_len} output tokens each (ignore_eos, greedy)", file=sys.stderr)
    print(f"dtype      {dtype_name(info.dtype)} for Ridgeline and the baselines; {arch.num_params / 1e6:.1f} M params"
          f"{f', {num_params / 1e6:.1f} M active per token' if arch.moe else ''}", file=sys.stderr)

    rl, rl_tokens = run_ridgeline(engine, prompts, args.output_len, warm, progress=not args.no_progress)
    results, agreement = [rl], None
    if args.baseline == "hf" and (args.hf_requests or args.hf_batch) and not skipped:
        folder, eos = info.model_folder, set(info.eos_token_ids)
        engine.close()  # tensor parallelism: the other ranks stop before the baseline runs
        engine = None
        gc.collect()
        model = hf_baseline.load_model(folder, info.dtype)
        print(f"HF         transformers {machine['transformers']} loaded {folder} in {model.load_seconds:.1f}s",
              file=sys.stderr)
        if args.hf_requests:
            one, hf_tokens = hf_baseline.one_at_a_time(model, prompts, args.output_len, args.hf_requests,
                                                       progress=not args.no_progress)
            results.append(one)
            agreement = greedy_agreement(rl_tokens, hf_tokens, eos)
        if args.hf_batch:
            results.append(hf_baseline.padded_batches(model, prompts, args.output_len, args.hf_batch,
                                                      args.hf_batch_requests, progress=not args.no_progress))
        del model

    print()
    print(f"Throughput: {args.model} ({dtype_name(info.dtype)}) on {machine['cpu']}, "
          f"{machine['torch_threads']} threads")
    print(throughput_table(results, num_params))
    lines, ratios = ratio_lines(rl, results[1:])
    if lines:
        print()
        print("\n".join(lines))
    if rl.extra.get("moe"):
        print("\n".join(["", *moe_report.lines(rl.extra["moe"])]))
    if rl.extra.get("tensor_parallel"):
        print("\n".join(["", *tp_report.lines(rl.extra["tensor_parallel"])]))
    if rl.extra.get("pipeline_parallel"):
        print("\n".join(["", *pp_report.lines(rl.extra["pipeline_parallel"])]))
    if agreement:
        print(f"greedy agreement with HF on {agreement['requests']} requests: {agreement['identical']} identical, "
              f"mean matching prefix {agreement['mean_matching_prefix']:.0%} (informational)")
    if skipped:
        print(f"\n{skipped}")
    if engine is not None:
        engine.close()
    wall = time.perf_counter() - wall0
    print(f"bench wall time {wall:.0f}s")
    if args.json:
        write_json(args.json, {
            "command": "throughput", "machine": machine,
            "engine": {"model": args.model, "model_folder": str(info.model_folder), "dtype": dtype_name(info.dtype),
                       "dtype_reason": info.dtype_reason, "num_params": num_params, "kernels": info.kernels,
                       "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs},
            "workload": {"name": args.workload, "seed": args.workload_seed, "num_requests": len(prompts),
                         "min_prompt": args.min_prompt, "max_prompt": args.max_prompt,
                         "prompt_tokens": sum(lens), "output_len": args.output_len},
            "results": [r.to_dict(num_params) for r in results], "ratios": ratios,
            "greedy_agreement": agreement, "baseline_skipped": skipped, "wall_s": wall})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_workload_args(p: argparse.ArgumentParser, seed_default: int | None = 0, structured: bool = False) -> None:
    """seed_default None: the workload follows the engine's --seed. structured: the structured workloads
    too (a bench that sends each prompt's constraint with it)."""
    from ridgeline.bench.workloads import WORKLOADS
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="chat", choices=[w for w in WORKLOADS if structured
                                                          or not (w.startswith("structured") or w == "tools")],
                   help="which prompts to send")
    g.add_argument("--num-requests", type=positive_int, default=256, metavar="N", help="requests in the timed run")
    g.add_argument("--min-prompt", type=positive_int, default=50, metavar="N",
                   help="shortest prompt in tokens, chat template included")
    g.add_argument("--max-prompt", type=positive_int, default=200, metavar="N", help="longest prompt in tokens")
    g.add_argument("--prefix-len", type=positive_int, default=1024, metavar="N",
                   help="shared-prefix workload: common prefix tokens")
    g.add_argument("--conversations", type=positive_int, default=8, metavar="N",
                   help="multi-turn workload: conversations interleaved turn by turn")
    g.add_argument("--turns", type=positive_int, default=8, metavar="N", help="multi-turn workload: turns per conversation")
    g.add_argument("--output-len", type=positive_int, default=128, metavar="N",
                   help="output tokens per request (ignore_eos)")
    g.add_argument("--workload-seed", type=int, default=seed_default, metavar="N",
                   help="seed that picks the prompts" + (" (default: --seed)" if seed_default is None else ""))


def add_throughput_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("throughput", help="offline throughput on a fixed-seed workload, vs HF transformers",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    g = p.add_argument_group("baselines")
    g.add_argument("--baseline", default="hf", choices=["hf", "none"],
                   help="hf: HF transformers on the same model, dtype and prompts (needs transformers)")
    g.add_argument("--hf-requests", type=non_negative_int, default=16, metavar="N",
                   help="HF one-at-a-time runs only this many requests (evenly spaced) and extrapolates "
                        "the rate; 0 skips it")
    g.add_argument("--hf-batch", type=non_negative_int, default=64, metavar="N",
                   help="HF padded batch size; 0 skips it")
    g.add_argument("--hf-batch-requests", type=positive_int, default=None, metavar="N",
                   help="HF padded batches run only the first whole batches covering this many requests "
                        "(default: all requests)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the results to FILE (default: none)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    p.set_defaults(func=cmd_throughput)
    return p
