"""`ridgeline cache-report FILE.jsonl`: registered into ridgeline.cli by its plugin hook."""
from __future__ import annotations

import argparse
import json
import sys

from ridgeline.cli_parser import output_file
from ridgeline.config import CacheConfig

DESCRIPTION = """Reads request bodies as `ridgeline serve --log-requests FILE` writes them (or any OpenAI-style chat
or completion bodies, one per line), tokenizes them with the model's tokenizer and chat template
(no weights are loaded) and reports what automatic prefix caching would save on that traffic:
the prefix-share fraction, the hit rate at each KV capacity (the engine's KV manager replayed in
arrival order), and where near-identical prompts diverge."""


def register(subparsers, command: str | None = None) -> None:
    p = subparsers.add_parser("cache-report", help="offline prefix-cache report on logged requests (JSONL)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="JSONL: one OpenAI-style request body per line (ridgeline serve --log-requests)")
    p.add_argument("--model", default="smollm2-135m", help="whose tokenizer and chat template to use")
    p.add_argument("--block-size", type=int, default=CacheConfig.block_size, help="the engine's KV block size")
    p.add_argument("--kv-tokens", nargs="+", default=None, metavar="N",
                   help="KV capacities to simulate, in tokens (e.g. 8192 65536 or 64k); default: unbounded")
    p.add_argument("--offload-tokens", default=None, metavar="N",
                   help="simulate a second KV tier (--kv-offload) of N tokens behind each capacity, e.g. 256k: "
                        "blocks evicted from the cache go there and hits in it are reported apart (default: none)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="requests holding KV blocks at once in the simulation")
    p.add_argument("--top", type=int, default=5, help="prefix groups to analyse for divergence")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="also write the report to FILE (default: none)")
    p.set_defaults(func=cmd_cache_report)


def cmd_cache_report(args: argparse.Namespace) -> int:
    from ridgeline.cache_report.analyze import divergences, share_fraction, simulate
    from ridgeline.cache_report.load import load_prompts
    from ridgeline.errors import InvalidRequestError
    from ridgeline.models.resolve import resolve_model
    from ridgeline.weights.tokenizer import Tokenizer

    CacheConfig(block_size=args.block_size)  # validates
    if args.concurrency < 1 or args.top < 0:
        raise InvalidRequestError("--concurrency must be >= 1 and --top >= 0")
    tok = Tokenizer(resolve_model(args.model, progress=True))
    records, problems = load_prompts(args.file, tok)
    prompts = [r.ids for r in records]
    salts = [r.salt for r in records]
    total = sum(map(len, prompts))
    bs = args.block_size
    capacities = [_tokens(t) for t in args.kv_tokens] if args.kv_tokens else [max(total, bs)]
    if min(capacities) < bs:
        raise InvalidRequestError(f"--kv-tokens must hold at least one block of {bs} tokens")
    offload = _tokens(args.offload_tokens) if args.offload_tokens else 0
    if offload and offload < bs:
        raise InvalidRequestError(f"--offload-tokens must hold at least one block of {bs} tokens")
    report = {
        "file": args.file, "requests": len(prompts), "prompt_tokens": total, "block_size": bs,
        "skipped_lines": problems, "share_fraction": share_fraction(prompts, bs, salts),
        "simulations": [vars(simulate(prompts, bs, c, args.concurrency, salts, offload)) for c in capacities],
        "concurrency": args.concurrency,
        "groups": [_group_dict(g, tok) for g in divergences(prompts, bs, args.top)],
    }
    print(format_report(report, bounded=bool(args.kv_tokens)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2, ensure_ascii=False)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _tokens(text: str) -> int:
    """'8192', '64k' (65536), '1m' -> tokens."""
    from ridgeline.errors import InvalidRequestError
    scale = {"k": 1 << 10, "m": 1 << 20}.get(text[-1:].lower(), 1)
    try:
        n = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        n = 0
    if n < 1:
        raise InvalidRequestError(f"--kv-tokens: expected a positive token count like 8192 or 64k, got {text!r}")
    return n


def _group_dict(g, tok) -> dict:
    ex = g.example()
    out = {"requests": g.count, "first_block_text": tok.decode(g.first_block, skip_special_tokens=False),
           "compared": len(g.divergences), "identical": g.count - 1 - len(g.divergences)}
    if ex is not None:
        pos = g.common_position
        out.update({
            "diverge_at": pos, "diverge_at_block": pos // len(g.first_block),
            "diverging_here": sum(d.position == pos for d in g.divergences),
            "context": tok.decode(g.reference[max(0, pos - 12):pos], skip_special_tokens=False),
            "reference_text": tok.decode(ex.reference, skip_special_tokens=False),
            "other_text": tok.decode(ex.other, skip_special_tokens=False),
            "agree_after": ex.agree_after})
    return out


def format_report(r: dict, bounded: bool) -> str:
    bs = r["block_size"]
    lines = [f"{r['file']}: {r['requests']} requests, {r['prompt_tokens']:,} prompt tokens, block size {bs}"]
    for p in r["skipped_lines"][:10]:
        lines.append(f"  skipped {p}")
    if len(r["skipped_lines"]) > 10:
        lines.append(f"  ... and {len(r['skipped_lines']) - 10} more skipped lines")
    tier = any(s.get("tier_capacity_tokens") for s in r["simulations"])
    lines += [f"prefix-share fraction f = {r['share_fraction']:.1%}  (prompt tokens in full blocks an earlier "
              "request already had: an unbounded cache's hit rate)", "",
              f"{'KV capacity':>14}  {'hit rate':>8}  {'prefill tokens saved':>20}  {'evictions':>9}  too long"
              + (f"  {'from the offload tier':>21}  {'tier loads/stores':>17}" if tier else "")]
    for s in r["simulations"]:
        cap = f"{s['capacity_tokens']:,} tok" if bounded else "unbounded"
        rate = s["hit_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0.0
        lines.append(f"{cap:>14}  {rate:>8.1%}  {s['hit_tokens']:>20,}  {s['evictions']:>9,}  {s['too_long']:>8}"
                     + (f"  {s['tier_hit_tokens']:>21,}  {s['tier_loads']:>8,}/{s['tier_stores']:<8,}" if tier else ""))
    if tier:
        lines.append(f"(the offload tier holds {r['simulations'][0]['tier_capacity_tokens']:,} tokens behind each "
                     "capacity; its hits are in the hit rate too; loads and stores in blocks, each the KV "
                     "bytes per block that start-up prints)")
    lines.append(f"(arrival order, {r['concurrency']} request(s) holding blocks at once; prompts only: "
                 "replies resent in later turns would add hits)")
    if r["groups"]:
        lines += ["", f"Most common prefixes (first {bs} tokens):"]
    for i, g in enumerate(r["groups"], 1):
        lines.append(f"{i:>2}. {g['requests']} requests start with {g['first_block_text']!r}")
        if "diverge_at" not in g:
            lines.append("    all identical")
            continue
        lines.append(f"    {g['diverging_here']} of {g['compared']} differ from the first one from token "
                     f"{g['diverge_at']} on (block {g['diverge_at_block']}; {g['identical']} identical):")
        lines.append(f"      …{g['context']!r} + {g['reference_text'][:80]!r}")
        lines.append(f"      vs {g['other_text'][:80]!r}")
        if g["agree_after"] >= bs:
            lines.append(f"    then {g['agree_after']:,} tokens agree again: a varying field early in the prompt; "
                         f"moving it after the shared text would let ~{g['agree_after'] // bs} more blocks hit")
    return "\n".join(lines)
