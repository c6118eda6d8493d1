"""`ridgeline bench decode`: batch-1 greedy decode speed, Ridgeline vs HF transformers.

One chat prompt of about --prompt-len tokens; each side generates output_len + 1 tokens and the
decode rate is the last output_len tokens over the time from the first token to the last (prefill
excluded; time to first token reported beside it). Best of --repeats runs, after a warm-up.
At batch 1 every weight a token runs through is read once per token, so the achieved weight bandwidth
is the bytes read per token (params x dtype bytes; quantized, as stored; a sparse layer's top-k experts)
x tok/s: compare it with the memory's read bandwidth to see how close decode is to its floor.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

from ridgeline.bench import hf_baseline
from ridgeline.bench.throughput import dtype_name, start
from ridgeline.bench.workloads import chat_workload
from ridgeline.cli_parser import output_file, positive_int
from ridgeline.measure.record import write_json
from ridgeline.utils.steal import StealMeter


def weight_bytes_per_token(arch, dtype) -> int:
    """Weights one decode step reads: all parameters a token runs through (a sparse layer's top_k
    experts), less the input embedding table when it is not tied to the output head (a lookup reads
    one row of it)."""
    params = arch.active_params - (0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size)
    return params * dtype.itemsize


def read_bytes_per_token(info, arch) -> int:
    """What a batch-1 decode step reads of the weights: quantized, the linears as stored (scales included,
    the norms' few KB left out, a sparse layer's top_k experts); dense, the parameters in the dtype."""
    if info.quantization == "none":
        return weight_bytes_per_token(arch, info.dtype)
    return info.weight_bytes_per_token or info.weight_bytes


def ridgeline_decode_timing(eng, prompt: list[int], output_len: int, tag: str, adapter: str | None = None) -> dict:
    """Drive the engine step by step, stamping each new token of one request (under a LoRA adapter, if named)."""
    from ridgeline.sampling_params import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=output_len + 1, ignore_eos=True)
    t0 = time.perf_counter()
    eng.add_request(tag, prompt, params, adapter=adapter)
    req = eng.requests[tag]
    stamps: list[float] = []
    steal = None  # the hypervisor's share of the CPUs over the decode (utils/steal.py)
    try:
        while not req.status.finished:
            eng.step(emit_unfinished=False)
            now = time.perf_counter()
            stamps += [now] * (req.num_output_tokens - len(stamps))
            if steal is None and stamps:
                steal = StealMeter()
    finally:
        eng.abort_request(tag)
    decode_s = stamps[-1] - stamps[0]
    return {"ttft_s": stamps[0] - t0, "decode_s": decode_s, "decode_tokens": len(stamps) - 1,
            "decode_tok_per_s": (len(stamps) - 1) / decode_s, "cpu_stolen": steal.fraction() if steal else None,
            "token_ids": list(req.output_token_ids)}


def _num(x: float) -> str:
    return f"{x:.1f}" if x >= 1 else f"{x:.3g}"


def _best(runs: list[dict]) -> dict:
    best = dict(max(runs, key=lambda r: r["decode_tok_per_s"]))
    best["all_decode_tok_per_s"] = [r["decode_tok_per_s"] for r in runs]
    best["all_cpu_stolen"] = [r.get("cpu_stolen") for r in runs]
    return best


def _run(tok_s: float, stolen: float | None) -> str:
    """one run's rate, with the CPU time the hypervisor took during it when any was taken"""
    return f"{tok_s:.1f}" + (f" ({stolen:.0%} stolen)" if stolen and stolen >= 0.005 else "")


def cmd_decode(args: argparse.Namespace) -> int:
    wall0, machine, engine = start(args)
    skipped = hf_baseline.unavailable(args.baseline == "hf", machine)
    if skipped:
        print(f"baseline   {skipped}", file=sys.stderr)
    arch, info = engine.arch, engine.info
    slack = max(4, args.prompt_len // 10)
    prompt = chat_workload(engine.tokenizer, 1, max(1, args.prompt_len - slack), args.prompt_len + slack,
                           args.workload_seed)[0]
    quantized = info.quantization != "none"
    wbytes = read_bytes_per_token(info, arch)
    label = dtype_name(info.dtype) + (f", {info.weight_formats}" if quantized else "")
    print(f"decode     prompt {len(prompt)} tokens, {args.output_len} decode tokens, dtype "
          f"{label}, weights read per token {_num(wbytes / 1e6)} MB; best of {args.repeats}",
          file=sys.stderr)
    ridgeline_decode_timing(engine, prompt, 8, "bench-decode-warmup")
    rl = _best([ridgeline_decode_timing(engine, prompt, args.output_len, f"bench-decode-{i}")
                for i in range(args.repeats)])
    rows = [("Ridgeline", rl)]
    hf = None
    if args.baseline == "hf" and not skipped:
        folder, eos = info.model_folder, set(info.eos_token_ids)
        del engine
        gc.collect()
        model = hf_baseline.load_model(folder, info.dtype)
        hf_baseline.warm_up(model)
        hf = _best([hf_baseline.decode_timing(model, prompt, args.output_len) for _ in range(args.repeats)])
        rows.append(("HF generate()", hf))
        del model

    print()
    print(f"Batch-1 decode: {args.model} ({label}) on {machine['cpu']}, "
          f"{machine['torch_threads']} threads; prompt {len(prompt)} tokens, {args.output_len} decode tokens")
    head = f"{'':<16}{'decode tok/s':>14}{'ms/token':>10}{'weights GB/s':>14}{'TTFT s':>9}   runs (tok/s)"
    print(head)
    print("-" * len(head))
    for name, r in rows:
        r["weight_gb_per_s"] = wbytes * r["decode_tok_per_s"] / 1e9
        runs = ", ".join(_run(x, st) for x, st in zip(r["all_decode_tok_per_s"],
                                                     r.get("all_cpu_stolen") or [None] * len(r["all_decode_tok_per_s"])))
        print(f"{name:<16}{r['decode_tok_per_s']:>14.1f}{1000 / r['decode_tok_per_s']:>10.1f}"
              f"{_num(r['weight_gb_per_s']):>14}{r['ttft_s']:>9.2f}   {runs}")
    ratio = agree = None
    if hf:
        ratio = rl["decode_tok_per_s"] / hf["decode_tok_per_s"]
        ours, theirs = rl["token_ids"], hf["token_ids"]
        cut = next((j for j, t in enumerate(ours) if t in eos), len(ours))
        agree = next((j for j, (a, b) in enumerate(zip(ours[:cut], theirs)) if a != b), min(cut, len(theirs)))
        print(f"\nRidgeline / HF: {ratio:.2f}x decode tok/s; greedy tokens agree for the first {agree} of {cut} "
              f"(compared up to Ridgeline's first EOS)")
    if skipped:
        print(f"\n{skipped}")
    wall = time.perf_counter() - wall0
    print(f"bench wall time {wall:.0f}s")
    if args.json:
        strip = lambda r: {k: v for k, v in r.items() if k != "token_ids"}  # noqa: E731
        write_json(args.json, {
            "command": "decode", "machine": machine,
            "engine": {"model": args.model, "dtype": dtype_name(info.dtype), "num_params": arch.num_params,
                       "quantization": info.quantization, "weight_formats": info.weight_formats,
                       "kernels": info.kernels, "weight_bytes_per_token": wbytes},
            "prompt_tokens": len(prompt), "output_len": args.output_len, "repeats": args.repeats,
            "ridgeline": strip(rl), "hf": strip(hf) if hf else None, "ratio": ratio,
            "greedy_agreement_tokens": agree, "baseline_skipped": skipped, "wall_s": wall})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_decode_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("decode", help="batch-1 decode tok/s and weight bandwidth, vs HF transformers",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-len", type=positive_int, default=100, metavar="N",
                   help="about this many prompt tokens")
    p.add_argument("--output-len", type=positive_int, default=128, metavar="N", help="decode tokens timed")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N",
                   help="timed runs per side; the best is reported")
    p.add_argument("--workload-seed", type=int, default=0, metavar="N", help="seed that picks the prompt")
    p.add_argument("--baseline", default="hf", choices=["hf", "none"],
                   help="hf: HF transformers on the same model, dtype and prompt (needs transformers)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the results to FILE (default: none)")
    p.set_defaults(func=cmd_decode)
    return p
