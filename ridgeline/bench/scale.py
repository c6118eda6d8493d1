"""`ridgeline bench scale`: the size ladder. Random-weight models of Llama-3.2-1B, Qwen2.5-3B and
Llama-3.1-8B shapes at full width and their own vocabularies (bench/scale_models.py), as GGUF files made by
llama.cpp's own converter and quantizer when they are given (F16 / Q8_0 / Q4_0 / Q4_K_M up to 3B, Q4_0 /
Q4_K_M at 8B), or the bf16 HF folder itself (`hf-bf16`); and a Gemma-3-270m shape (Q4_K_M: narrow layers,
a 262,144-token head) for a family that is not Llama-shaped. Free disk and memory are checked first and every
row that does not fit, or lacks a tool, is printed as skipped with the reason.

Per row: batch-1 decode tok/s and the weight bytes it reads per second against the read bandwidth measured
in the same run (1 GiB read, best of 5); prefill of --prompt-len tokens in tok/s and GOP/s against the bf16
and int8 matmul peaks measured in the same run; decode at each --batch-sizes; and llama.cpp's `llama-bench`
(pp, tg) and `llama-batched-bench` on the same file where they are found. One table, one plot (--plot).
Speculative decoding stays off (`none`): this measures the target's own passes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ridgeline.bench.scale_models import SHAPES, Shape, converter_view, default_tokenizer, write_checkpoint
from ridgeline.cli_parser import output_file, positive_int
from ridgeline.errors import InvalidRequestError

FORMATS = ("f16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "hf-bf16")
DEFAULT_FORMATS = {"llama-3.2-1b": ("f16", "q8_0", "q4_0", "q4_k_m"), "qwen2.5-3b": ("f16", "q8_0", "q4_0", "q4_k_m"),
                   "llama-3.1-8b": ("q4_0", "q4_k_m"), "gemma-3-270m": ("q4_k_m",), "tiny": ("hf-bf16",)}
BITS = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_k_m": 4.9, "q5_k_m": 5.7, "hf-bf16": 16.0}  # per weight, about
QUANT_TYPE = {"q4_0": "Q4_0", "q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M"}  # made by llama-quantize from the F16 file
MARGIN = 2 << 30  # memory kept free beside a model's weights (KV cache, activations, the process)


def _list(text: str, known, what: str) -> list[str]:
    out = [p.strip().lower() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in known]
    if bad or not out:
        raise InvalidRequestError(f"--{what}: {', '.join(bad) or 'none given'}; known: {', '.join(known)}", what)
    return out


# ---- this machine's ceilings, measured in the run ----------------------------------------------------
def probe(threads: int) -> dict:
    """Read bandwidth (a 1 GiB sum, best of 5) and torch's bf16 and int8 matmul rates (512 x 4096 x 4096, best of
    10: a shared machine's rates move run to run, the best is the ceiling)."""
    import torch
    torch.set_num_threads(threads)
    x = torch.ones(1 << 28)  # 1 GiB of fp32

    def best(fn, n):
        fn()
        out = float("inf")
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out = min(out, time.perf_counter() - t0)
        return out
    read = (1 << 30) / best(lambda: x.sum(), 5) / 1e9
    del x
    a, b = torch.randn(512, 4096).bfloat16(), torch.randn(4096, 4096).bfloat16()
    bf16 = 2 * 512 * 4096 * 4096 / best(lambda: a @ b, 10) / 1e9
    ai, bi = torch.randint(-127, 127, (512, 4096), dtype=torch.int8), torch.randint(-127, 127, (4096, 4096),
                                                                                      dtype=torch.int8)
    try:
        int8 = 2 * 512 * 4096 * 4096 / best(lambda: torch._int_mm(ai, bi), 10) / 1e9
    except RuntimeError:
        int8 = None
    return {"read_gb_per_s": read, "bf16_gflop_per_s": bf16, "int8_gop_per_s": int8, "threads": threads}


# ---- llama.cpp's tools ------------------------------------------------------------------------------
def find_tools(bin_dir: str | None, tree: str | None) -> dict:
    """The llama.cpp tools found: binaries from bin_dir or PATH, the converter from the source tree."""
    def which(name):
        if bin_dir:
            p = Path(bin_dir) / name
            return str(p) if p.is_file() and os.access(p, os.X_OK) else None
        return shutil.which(name)
    tools = {n: which(n) for n in ("llama-quantize", "llama-bench", "llama-batched-bench")}
    conv = Path(tree) / "convert_hf_to_gguf.py" if tree else None
    tools["convert"] = str(conv) if conv is not None and conv.is_file() else None
    return tools


def _run(cmd: list[str], env: dict | None = None, out: Path | None = None) -> str:
    print("  $ " + " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    if out is not None:
        out.write_text(r.stdout)
    return r.stdout


def make_gguf(tools: dict, tree: str, folder: Path, fmt: str, work: Path, shape: Shape) -> Path:
    """The GGUF of `folder` in fmt: the converter writes F16 and Q8_0, llama-quantize the rest from F16."""
    dst = work / f"{folder.name}-{fmt}.gguf"
    if dst.is_file():
        return dst
    if fmt in ("f16", "q8_0"):
        env = {**os.environ, "PYTHONPATH": str(Path(tree) / "gguf-py")}
        _run([sys.executable, tools["convert"], str(converter_view(folder, shape, work)), "--outtype", fmt,
              "--outfile", str(dst) + ".tmp"], env)
    else:
        f16 = make_gguf(tools, tree, folder, "f16", work, shape)
        _run([tools["llama-quantize"], str(f16), str(dst) + ".tmp", QUANT_TYPE[fmt]])
    os.replace(str(dst) + ".tmp", dst)
    return dst


def llama_cpp_rates(tools: dict, path: Path, threads: int, prompt_len: int, batches: list[int],
                    work: Path, repeats: int = 3) -> dict:
    """llama-bench's pp<prompt_len> and tg128, llama-batched-bench's decode rate at each batch size."""
    from ridgeline.bench.long_context import llama_bench_rates
    out: dict = {}
    if tools.get("llama-bench"):
        js = work / f"{path.stem}.llama-bench.json"
        _run([tools["llama-bench"], "-m", str(path), "-t", str(threads), "-p", str(prompt_len), "-n", "128",
              "-r", str(repeats), "-o", "json"], out=js)
        rates = llama_bench_rates(str(js))
        out["prefill_tok_per_s"] = rates["pp"].get(prompt_len)
        out["decode_tok_per_s"] = rates["tg"].get(0)
    if tools.get("llama-batched-bench") and batches:
        text = _run([tools["llama-batched-bench"], "-m", str(path), "-t", str(threads), "-c", "8192", "-npp", "32",
                     "-ntg", "32", "-npl", ",".join(map(str, batches)), "--output-format", "jsonl"])
        out["batched_decode_tok_per_s"] = parse_batched(text)
    return out


def parse_batched(text: str) -> dict[int, float]:
    """llama-batched-bench's output (jsonl lines, or its markdown table) -> {batch: decode tok/s}."""
    rates: dict[int, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                e = json.loads(line)
                rates[int(e["pl"])] = float(e["speed_tg"])
            except (ValueError, KeyError):
                pass
        elif line.startswith("|") and not rates:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) >= 8 and cells[2].isdigit():  # | PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | ...
                try:
                    rates[int(cells[2])] = float(cells[7])
                except ValueError:
                    pass
    return rates


# ---- Ridgeline on one file --------------------------------------------------------------------------
A8 = {"q4_0": "gguf-a8", "q8_0": "gguf-a8", "q4_k_m": "gguf-a8", "q5_k_m": "gguf-a8"}  # --a8: int8 activations


def measure_ridgeline(path: Path, fmt: str, prompt_len: int, output_len: int, batches: list[int],
                      repeats: int = 3, quantization: str | None = None) -> dict:
    """Batch-1 decode and a prefill of prompt_len tokens (each the best of repeats), and decode at each batch
    size; quantization: an engine --quantization other than the file's default (the --a8 rows)."""
    import gc

    from ridgeline.bench.decode import read_bytes_per_token, ridgeline_decode_timing
    from ridgeline.config import EngineConfig
    from ridgeline.engine.llm_engine import LLMEngine
    from ridgeline.sampling_params import SamplingParams

    opts = dict(max_model_len=max(2048, prompt_len + 64), kv_cache_memory="1GiB", progress=False,
                speculative_method="none", enable_prefix_caching=False)  # every pass computed; torch's threads
    if fmt == "hf-bf16":
        opts.update(dtype="bfloat16", quantization="none")
    if quantization is not None:
        opts.update(quantization=quantization)
    eng = LLMEngine(EngineConfig.from_kwargs(str(path), **opts))
    try:
        vocab = min(eng.arch.vocab_size, eng.tokenizer.vocab_size)  # ids the tokenizer has
        ids = [(7 + 31 * j) % (vocab - 300) + 100 for j in range(prompt_len)]
        ridgeline_decode_timing(eng, ids[:32], 4, "scale-warmup")
        decode = max(ridgeline_decode_timing(eng, ids[:32], output_len, f"scale-decode-{i}")["decode_tok_per_s"]
                     for i in range(repeats))
        prefill = min(ridgeline_decode_timing(eng, ids, 1, f"scale-prefill-{i}")["ttft_s"] for i in range(repeats))
        row = {"decode_tok_per_s": decode, "prefill_tok_per_s": prompt_len / prefill,
               "read_bytes_per_token": read_bytes_per_token(eng.info, eng.arch),
               "weight_formats": eng.info.weight_formats or "bf16", "batched_decode_tok_per_s": {}}
        for n in batches:
            row["batched_decode_tok_per_s"][n] = _batched(eng, ids[:32], n, output_len, SamplingParams)
        return row
    finally:
        del eng
        gc.collect()


def _batched(eng, prompt: list[int], n: int, output_len: int, sampling) -> float:
    """n requests decoding together: their tokens after each has its first, over the time that took."""
    params = sampling(temperature=0, max_tokens=output_len + 1, ignore_eos=True)
    tags = [f"scale-b{n}-{i}" for i in range(n)]
    for i, tag in enumerate(tags):
        eng.add_request(tag, [prompt[0] + i % 50] + prompt[1:], params)
    reqs = [eng.requests[t] for t in tags]
    try:
        while any(r.num_output_tokens < 1 for r in reqs):
            eng.step(emit_unfinished=False)
        t0, done0 = time.perf_counter(), sum(r.num_output_tokens for r in reqs)
        while not all(r.status.finished for r in reqs):
            eng.step(emit_unfinished=False)
        return (sum(r.num_output_tokens for r in reqs) - done0) / (time.perf_counter() - t0)
    finally:
        for tag in tags:
            eng.abort_request(tag)


# ---- the ladder -------------------------------------------------------------------------------------
def plan_rows(sizes: list[str], formats: list[str] | None, tools: dict, free_disk: int, free_mem: int,
              cached: set[str] = frozenset()) -> tuple[list[tuple[str, str]], list[str]]:
    """(size, format) rows to run, and a line per row skipped with its reason. Disk counts what is not made
    yet (the bf16 folder, the F16 file a quantized one is made from, the file), memory the row's weights."""
    rows, skipped, disk = [], [], free_disk
    for size in sizes:
        shape = SHAPES[size]
        made: set[str] = set()
        for fmt in formats or DEFAULT_FORMATS[size]:
            weights = int(shape.params * BITS[fmt] / 8)
            keys = {f"{size}-{f}" for f in ("hf-bf16",) + (("f16",) if fmt in QUANT_TYPE else ()) + (fmt,)}
            new = keys - made - set(cached)
            need = sum(int(shape.params * BITS[k[len(size) + 1:]] / 8) for k in new)
            if fmt != "hf-bf16":
                missing = [t for t in (("convert",) + (("llama-quantize",) if fmt in QUANT_TYPE else ()))
                           if not tools.get(t)]
                if missing:
                    skipped.append(f"{size} {fmt}: needs llama.cpp's {', '.join(missing)} (--llama-cpp-tree, "
                                   "--llama-cpp-bin)")
                    continue
            if need > disk:
                skipped.append(f"{size} {fmt}: needs {need / 2**30:.1f} GiB of disk, {disk / 2**30:.1f} GiB free")
                continue
            if weights + MARGIN > free_mem:
                skipped.append(f"{size} {fmt}: needs {(weights + MARGIN) / 2**30:.1f} GiB of memory, "
                               f"{free_mem / 2**30:.1f} GiB available")
                continue
            disk -= need
            made |= new
            rows.append((size, fmt))
    return rows, skipped


def _available_memory() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _dense_params(shape: Shape) -> int:
    """What a prefill multiplies per token: every parameter but the embedding (a lookup) and the LM head
    (the last token's only)."""
    return shape.params - shape.vocab * shape.hidden * (1 if shape.tied else 2)


def cmd_scale(args: argparse.Namespace) -> int:
    sizes = _list(args.sizes, list(SHAPES), "sizes")
    formats = _list(args.formats, FORMATS, "formats") if args.formats else None
    batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()] if args.batch_sizes else []
    if any(b < 2 for b in batches):
        raise InvalidRequestError("--batch-sizes: each at least 2 (batch 1 is always measured)", "batch_sizes")
    work = Path(args.work or Path(tempfile.gettempdir()) / "ridgeline-scale")
    work.mkdir(parents=True, exist_ok=True)
    tools = find_tools(args.llama_cpp_bin, args.llama_cpp_tree)
    cached = {p.name.removesuffix(".gguf") for p in work.glob("*.gguf")} | \
             {f"{p.name}-hf-bf16" for p in work.iterdir() if (p / "model.safetensors.index.json").is_file()}
    rows, skipped = plan_rows(sizes, formats, tools, shutil.disk_usage(work).free, _available_memory(), cached)
    for line in skipped:
        print(f"skipped    {line}", file=sys.stderr)
    threads = args.threads or len(os.sched_getaffinity(0))
    print(f"probing    read bandwidth and matmul peaks on {threads} threads", file=sys.stderr)
    ceil = probe(threads)
    tokenizer = Path(args.tokenizer) if args.tokenizer else default_tokenizer()
    results = []
    for size, fmt in rows:
        shape = SHAPES[size]
        folder = write_checkpoint(shape, work / size, tokenizer)
        try:
            path = folder if fmt == "hf-bf16" else make_gguf(tools, args.llama_cpp_tree, folder, fmt, work, shape)
        except RuntimeError as e:  # a tool failed: this row is skipped, the ladder goes on
            skipped.append(f"{size} {fmt}: {e}")
            print(f"skipped    {skipped[-1]}", file=sys.stderr)
            continue
        print(f"measuring  {size} {fmt} ({path})", file=sys.stderr)
        row = {"size": size, "format": fmt, "params": shape.params, "file_bytes": _size(path),
               "ridgeline": measure_ridgeline(path, fmt, args.prompt_len, args.output_len, batches,
                                                   args.repeats)}
        r = row["ridgeline"]
        r["read_gb_per_s"] = r["read_bytes_per_token"] * r["decode_tok_per_s"] / 1e9
        r["prefill_gop_per_s"] = 2 * _dense_params(shape) * r["prefill_tok_per_s"] / 1e9
        if args.a8 and fmt in A8:
            a8 = measure_ridgeline(path, fmt, args.prompt_len, args.output_len, batches, args.repeats, A8[fmt])
            r["a8"] = {"quantization": A8[fmt], "prefill_tok_per_s": a8["prefill_tok_per_s"],
                       "prefill_gop_per_s": 2 * _dense_params(shape) * a8["prefill_tok_per_s"] / 1e9,
                       "decode_tok_per_s": a8["decode_tok_per_s"],
                       "batched_decode_tok_per_s": a8["batched_decode_tok_per_s"]}
        if fmt != "hf-bf16" and (tools.get("llama-bench") or tools.get("llama-batched-bench")):
            row["llama_cpp"] = llama_cpp_rates(tools, path, threads, args.prompt_len, batches, work, args.repeats)
        results.append(row)
    print(render(results, ceil, args.prompt_len, batches))
    for line in skipped:
        print(f"skipped: {line}")
    if args.json:
        from ridgeline.measure.record import write_json
        write_json(args.json, {"command": "scale", "ceilings": ceil, "rows": results, "skipped": skipped,
                               "prompt_len": args.prompt_len, "output_len": args.output_len, "batch_sizes": batches})
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot and results:
        plot(results, ceil, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _rate(x) -> str:
    return f"{x:.1f}" if x else "-"


def render(results: list[dict], ceil: dict, prompt_len: int, batches: list[int]) -> str:
    read, bf16, int8 = ceil["read_gb_per_s"], ceil["bf16_gflop_per_s"], ceil["int8_gop_per_s"]
    lines = [f"Size ladder: read {read:.1f} GB/s, bf16 matmul {bf16:.0f} GFLOP/s, int8 "
             f"{int8:.0f} GOP/s" if int8 else f"Size ladder: read {read:.1f} GB/s, bf16 matmul {bf16:.0f} GFLOP/s",
             "", "| model | format | weights read | decode tok/s (GB/s, of read) | llama.cpp tg | "
             f"prefill {prompt_len} tok/s (GOP/s, of bf16 peak) | llama.cpp pp | "
             + " | ".join(f"batch {b} tok/s (llama.cpp)" for b in batches) + " |",
             "|" + "---|" * (7 + len(batches))]
    for row in results:
        r, lc = row["ridgeline"], row.get("llama_cpp") or {}
        theirs = lc.get("batched_decode_tok_per_s") or {}
        batched = " | ".join(f"{r['batched_decode_tok_per_s'][b]:.1f} ({_rate(theirs.get(b))})" for b in batches)
        lines.append(
            f"| {row['size']} | {row['format']} | {r['read_bytes_per_token'] / 1e6:.0f} MB "
            f"| {r['decode_tok_per_s']:.1f} ({r['read_gb_per_s']:.1f}, {r['read_gb_per_s'] / read:.0%}) "
            f"| {_rate(lc.get('decode_tok_per_s'))} ({_ratio(r['decode_tok_per_s'], lc.get('decode_tok_per_s'))}) "
            f"| {r['prefill_tok_per_s']:.0f} ({r['prefill_gop_per_s']:.0f}, {r['prefill_gop_per_s'] / bf16:.0%}) "
            f"| {_rate(lc.get('prefill_tok_per_s'))} ({_ratio(r['prefill_tok_per_s'], lc.get('prefill_tok_per_s'))}) "
            + (f"| {batched} " if batches else "") + "|")
    for row in results:
        a8, lc = row["ridgeline"].get("a8"), row.get("llama_cpp") or {}
        if a8:
            lines.append(f"| {row['size']} | {row['format']} {a8['quantization']} (int8 activations) | | "
                         f"{a8['decode_tok_per_s']:.1f} | | {a8['prefill_tok_per_s']:.0f} ({a8['prefill_gop_per_s']:.0f}, "
                         f"{a8['prefill_gop_per_s'] / (int8 or bf16):.0%} of the int8 peak) "
                         f"| {_rate(lc.get('prefill_tok_per_s'))} ({_ratio(a8['prefill_tok_per_s'], lc.get('prefill_tok_per_s'))}) "
                         + "".join(f"| {a8['batched_decode_tok_per_s'][b]:.1f} " for b in batches) + "|")
    lines += [""] + [f"{row['size']} {row['format']}: {row['ridgeline']['weight_formats']}" for row in results]
    return "\n".join(lines)


def plot(results: list[dict], ceil: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['size']}\n{r['format']}" for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(results)), 4))
    a.bar(labels, [r["ridgeline"]["read_gb_per_s"] for r in results], color="#3b7dd8")
    a.axhline(ceil["read_gb_per_s"], color="k", ls="--", label=f"read {ceil['read_gb_per_s']:.1f} GB/s")
    a.set_ylabel("batch-1 decode, weight GB/s")
    a.legend()
    b.bar(labels, [r["ridgeline"]["prefill_gop_per_s"] for r in results], color="#d8833b")
    b.axhline(ceil["bf16_gflop_per_s"], color="k", ls="--", label="bf16 matmul peak")
    if ceil.get("int8_gop_per_s"):
        b.axhline(ceil["int8_gop_per_s"], color="grey", ls=":", label="int8 matmul peak")
    b.set_ylabel("prefill GOP/s")
    b.legend()
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def add_scale_parser(bsub) -> argparse.ArgumentParser:
    p = bsub.add_parser("scale", help="the size ladder: 1B / 3B / 8B shapes as GGUF files, against this "
                        "machine's bandwidth and matmul peaks and llama.cpp", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="llama-3.2-1b,qwen2.5-3b,llama-3.1-8b", metavar="LIST",
                   help=f"model shapes, comma-separated (known: {', '.join(SHAPES)})")
    p.add_argument("--formats", default=None, metavar="LIST",
                   help=f"formats for every size (known: {', '.join(FORMATS)}); default: F16, Q8_0, Q4_0, "
                        "Q4_K_M up to 3B, Q4_0 and Q4_K_M at 8B")
    p.add_argument("--work", default=None, metavar="DIR",
                   help="where the checkpoints and GGUF files are written and reused (default: a folder in the "
                        "temporary directory)")
    p.add_argument("--llama-cpp-tree", default=None, metavar="DIR",
                   help="llama.cpp's source tree (its convert_hf_to_gguf.py and gguf-py), to make the GGUF files "
                        "(default: none: no GGUF rows)")
    p.add_argument("--llama-cpp-bin", default=None, metavar="DIR",
                   help="llama.cpp's binaries (llama-quantize, llama-bench, llama-batched-bench); default: PATH")
    p.add_argument("--tokenizer", default=None, metavar="FOLDER",
                   help="tokenizer.json and tokenizer_config.json from this folder, one llama.cpp's converter recognizes "
                        "for the shape's family (default: the default model's, which it takes for the Llama shapes)")
    p.add_argument("--prompt-len", type=positive_int, default=512, metavar="N", help="prefill length timed")
    p.add_argument("--output-len", type=positive_int, default=64, metavar="N", help="decode tokens timed")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N",
                   help="batch-1 decode and prefill runs per row, the best kept (llama-bench -r N)")
    p.add_argument("--a8", action="store_true",
                   help="also run the quantized GGUF files with int8 activations against their blocks "
                        "(--quantization gguf-a8) (default: off)")
    p.add_argument("--batch-sizes", default="16,64", metavar="LIST", help="batched decode sizes beside batch 1")
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="threads for both engines (default: the CPUs this process may use)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE", help="also write the rows to FILE (default: none)")
    p.add_argument("--plot", type=output_file, default=None, metavar="FILE", help="a PNG of the ladder (default: none)")
    p.set_defaults(func=cmd_scale)
    return p
