"""`ridgeline bench lora`: what LoRA adapters cost, against the base model alone, in one process.

Adapters of --rank on every attention and MLP projection are written as PEFT folders with random bf16
weights (lora_alpha = 2 x rank), shaped for the model. Batch-1 greedy decode of --output-len tokens with no
adapter and with one, alternated --repeats times (best of each); then offline throughput of --num-requests
chat requests spread round-robin over each count of distinct adapters in --adapters (0: the base alone).
Speculative decoding stays off (`none`)."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ridgeline.cli_parser import output_file, positive_int
from ridgeline.errors import InvalidRequestError

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(arch, folder: Path, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder for arch with random bf16 A and B on every target of every layer."""
    import torch
    from safetensors.torch import save_file
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = {"q_proj": (q, arch.hidden_size), "k_proj": (kv, arch.hidden_size), "v_proj": (kv, arch.hidden_size),
              "o_proj": (arch.hidden_size, q), "gate_proj": (arch.intermediate_size, arch.hidden_size),
              "up_proj": (arch.intermediate_size, arch.hidden_size),
              "down_proj": (arch.hidden_size, arch.intermediate_size)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(arch.num_layers):
        for t in TARGETS:
            out, inp = shapes[t]
            mod = "mlp" if t in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{mod}.{t}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, inp, generator=gen) / inp ** 0.5).bfloat16()
            tensors[f"{key}.lora_B.weight"] = (torch.randn(out, rank, generator=gen) * 0.01).bfloat16()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS), "bias": "none"}))
    return folder


def _decode_rate(engine, prompt: list[int], output_len: int, adapter: str | None) -> float:
    from ridgeline.bench.decode import ridgeline_decode_timing
    t = ridgeline_decode_timing(engine, prompt, output_len, f"lora-decode-{time.monotonic_ns()}", adapter)
    return t["decode_tokens"] / t["decode_s"]


def cmd_lora(args: argparse.Namespace) -> int:
    from ridgeline.bench.throughput import build_engine
    from ridgeline.bench.workloads import chat_workload
    from ridgeline.engine.run import run_to_completion
    from ridgeline.lora.attach import attach
    from ridgeline.lora.request import LoRARequest
    from ridgeline.sampling_params import SamplingParams
    counts = sorted({int(c) for c in args.adapters.split(",") if c.strip()})
    if not counts or counts[0] < 0:
        raise InvalidRequestError("--adapters: a list of adapter counts, each at least 0", "adapters")
    args.enable_lora, args.max_lora_rank = True, max(args.rank, 1)
    args.speculative_method = "none"
    engine = build_engine(args)
    manager = attach(engine)
    work = Path(tempfile.mkdtemp(prefix="ridgeline-bench-lora-"))
    names = []
    for i in range(max(counts + [1])):
        name = f"lora{i}"
        manager.register(LoRARequest(name, i + 1, str(write_adapter(engine.arch, work / name, args.rank, i))))
        names.append(name)
    mb = manager.bytes[names[0]] / 1e6
    print(f"adapters: rank {args.rank} on {', '.join(TARGETS)}; {mb:.1f} MB each ({work})", file=sys.stderr)
    prompts = chat_workload(engine.tokenizer, max(args.num_requests, 1), seed=0)
    base_rate = lora_rate = 0.0
    for _ in range(args.repeats):
        base_rate = max(base_rate, _decode_rate(engine, prompts[0], args.output_len, None))
        lora_rate = max(lora_rate, _decode_rate(engine, prompts[0], args.output_len, names[0]))
    rows = []
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    for k in counts:
        adapters = [names[i % k] if k else None for i in range(len(prompts))]
        t0 = time.perf_counter()
        outs = run_to_completion(engine, prompts, params, adapters=adapters)
        dt = time.perf_counter() - t0
        rows.append({"adapters": k, "out_tok_per_s": sum(len(o.outputs[0].token_ids) for o in outs) / dt})
    print(f"\nLoRA adapters on {args.model} ({engine.info.weight_formats})")
    print(f"rank {args.rank}, {mb:.1f} MB an adapter; batch-1 decode of {args.output_len} tokens, best of "
          f"{args.repeats}; {len(prompts)} requests x {args.output_len} tokens\n")
    print("| | tok/s | vs the base |\n|---|---|---|")
    print(f"| batch-1 decode, base | {base_rate:.1f} | |")
    print(f"| batch-1 decode, one adapter | {lora_rate:.1f} | {lora_rate / base_rate:.2f}x |")
    base_tp = next((r["out_tok_per_s"] for r in rows if r["adapters"] == 0), None)
    for r in rows:
        ratio = f"{r['out_tok_per_s'] / base_tp:.2f}x" if base_tp and r["adapters"] else ""
        print(f"| throughput, {r['adapters']} adapters | {r['out_tok_per_s']:.1f} | {ratio} |")
    if args.json:
        from ridgeline.measure.record import write_json
        write_json(args.json, {"command": "lora", "rank": args.rank, "adapter_mb": mb, "decode_base": base_rate,
                               "decode_lora": lora_rate, "throughput": rows, "output_len": args.output_len,
                               "num_requests": len(prompts)})
    return 0


def add_lora_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("lora", help="LoRA adapters' cost: batch-1 decode and throughput against the base alone",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=positive_int, default=16, metavar="R", help="every adapter's rank (at most 256)")
    p.add_argument("--adapters", default="0,1,8", metavar="LIST",
                   help="throughput runs: counts of distinct adapters the requests are spread over (0: the base)")
    p.add_argument("--num-requests", type=positive_int, default=64, metavar="N", help="requests per throughput run")
    p.add_argument("--output-len", type=positive_int, default=128, metavar="N", help="tokens each request generates")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N", help="alternated batch-1 decode runs")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the results to FILE (default: none)")
    p.set_defaults(func=cmd_lora)
    return p
