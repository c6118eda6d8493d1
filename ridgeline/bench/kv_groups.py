"""`ridgeline bench kv-groups`: the KV bytes one request holds on a model mixing sliding-window (local) and
full-attention (global) layers, with a block table per KV group (the local groups' blocks behind their
window freed) and with one table for every layer (--disable-hybrid-kv-cache-manager), side by side in one
run, and whether greedy output is the same.

The model is a random-weight one with a published model's layer layout (layer count, which layers are
local, the window, KV heads and head size) and small hidden widths (they change neither the KV bytes per
token nor which blocks are held); the prompt is `--context` random tokens, then `--decode-tokens` greedy
ones. Bytes are pages held x bytes per page, sampled after every step.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ridgeline.cli_parser import output_file, positive_int

# published layouts: (transformers config class, layers, every n-th layer global, window, KV heads, head size)
LAYOUTS = {
    "gemma-3-1b": ("Gemma3TextConfig", 26, 6, 512, 1, 256),
    "gemma-3-4b": ("Gemma3TextConfig", 34, 6, 1024, 4, 256),
    "gemma-3-12b": ("Gemma3TextConfig", 48, 6, 1024, 8, 256),
    "gemma-3-27b": ("Gemma3TextConfig", 62, 6, 1024, 16, 128),
    "gemma-2-9b": ("Gemma2Config", 42, 2, 4096, 8, 256),
}


def add_kv_groups_parser(sub) -> None:
    p = sub.add_parser("kv-groups", help="KV bytes per request with a table per local/global layer group vs "
                                         "one table, same run",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--like", default="gemma-3-1b", choices=sorted(LAYOUTS), help="the layer layout")
    p.add_argument("--context", type=positive_int, default=8192, metavar="N", help="prompt tokens")
    p.add_argument("--decode-tokens", type=positive_int, default=16, metavar="N", help="greedy tokens after it")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="weights and KV")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the results as JSON (default: none)")
    p.set_defaults(func=cmd_kv_groups)


def write_model(like: str, out: Path, max_len: int) -> tuple[int, int, int]:
    """A random-weight folder with the layout of `like`; returns (layers, global layers, window)."""
    import torch
    import transformers

    from ridgeline.bench.random_model import _tokenizer
    cls, layers, every, window, kv_heads, head_dim = LAYOUTS[like]
    types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
    vocab = _tokenizer(out, None)
    cfg = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
               num_attention_heads=kv_heads * 2, num_key_value_heads=kv_heads, head_dim=head_dim,
               sliding_window=window, layer_types=types, max_position_embeddings=max_len, bos_token_id=257,
               eos_token_id=258, query_pre_attn_scalar=head_dim)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**cfg), dtype=torch.float32)
    model.save_pretrained(out)
    return layers, types.count("full_attention"), window


def measure(folder: Path, ids: list[int], decode: int, dtype: str, hybrid: bool) -> dict:
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.sampling_params import SamplingParams
    max_len = len(ids) + decode + 1
    eng = LLMEngine(EngineConfig.from_kwargs(str(folder), dtype=dtype, quantization="none", max_model_len=max_len,
                                             enable_prefix_caching=False, hybrid_kv_cache=hybrid, progress=False,
                                             speculative_method="none"))
    page = eng.info.kv_spec.bytes_per_block
    eng.add_request("r", ids, SamplingParams(temperature=0, max_tokens=decode, ignore_eos=True))
    peak, last, out, t0 = 0, 0, None, time.perf_counter()
    while eng.has_unfinished():
        for o in eng.step(emit_unfinished=False):
            if o.finished:
                out = o.outputs[0].token_ids
        if eng.scheduler.running:
            last = eng.kv.held_blocks("r") * page
            peak = max(peak, last)
    eng.kv.check_integrity()
    groups = eng.kv.groups
    return {"hybrid": hybrid, "groups": groups.describe() if groups else "one table", "page_bytes": page,
            "peak_bytes": peak, "final_bytes": last, "tokens": out, "seconds": time.perf_counter() - t0}


def cmd_kv_groups(args: argparse.Namespace) -> int:
    import random
    T = args.context + args.decode_tokens
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        n, n_global, window = write_model(args.like, folder, T + 16)
        rng = random.Random(0)
        ids = [rng.randrange(256) for _ in range(args.context)]
        runs = [measure(folder, ids, args.decode_tokens, args.dtype, hybrid) for hybrid in (True, False)]
    grouped, one = runs
    share = grouped["final_bytes"] / one["final_bytes"]
    bound = (n_global + (n - n_global) * window / T) / n  # every local layer holding exactly its window
    print(f"{args.like}: {n} layers ({n_global} global, window {window}), {args.context} + {args.decode_tokens} "
          f"tokens, {args.dtype}")
    print(f"{'':<28}{'KV bytes at the end':>20}{'peak':>14}{'seconds':>9}")
    for r in runs:
        print(f"{r['groups'][:26]:<28}{r['final_bytes']:>20,}{r['peak_bytes']:>14,}{r['seconds']:>9.1f}")
    print(f"grouped / one table: {share:.3f} (the layers' own share at {T} tokens: {bound:.3f}); greedy output "
          f"{'identical' if grouped['tokens'] == one['tokens'] else 'DIFFERS'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"like": args.like, "layers": n, "global_layers": n_global,
                                               "window": window, "tokens": T, "share": share, "bound": bound,
                                               "runs": runs}, indent=1))
    if grouped["tokens"] != one["tokens"]:
        print("error: greedy output differs between the two layouts", file=sys.stderr)
        return 1
    return 0
