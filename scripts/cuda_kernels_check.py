"""CUDA check of the quantized-weight Triton kernel and the flash attention backend, run on a GPU machine.

python3 scripts/cuda_kernels_check.py [quant] [flash] [engine]   (all three without arguments)

quant   every weight format's packed kernel against dequantize-then-matmul (bf16 and fp32 inputs), a
        row's result alone vs beside others, and matmul times against bf16 F.linear at 7-8B-model shapes
flash   the "flash" backend against "sdpa" on tiny Llama / Qwen2 / Mistral (chunked prefill, prefix
        hits, sliding window), and prefill / decode times at long context on SmolLM2-135M shapes
engine  a 0.4B-parameter random Llama per weight format: greedy agreement with bf16 and decode tok/s
"""
from __future__ import annotations

import gc
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import make_tiny_model  # noqa: E402

from ridgeline import LLM, SamplingParams  # noqa: E402

DEV = "cuda"


def bench(fn, reps: int = 50) -> float:
    """Median milliseconds of fn() on the GPU (CUDA events), after warm-up."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def wall(fn, reps: int = 200) -> float:
    """Microseconds per call by the host clock over back-to-back calls (the CPU's launch cost shows)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e6


def quant() -> None:
    from ridgeline.kernels import triton_quant as tq
    from ridgeline.formats import fpq, rtn
    torch.manual_seed(0)

    def formats(w):
        return {"int8": rtn.quantize_int8(w), "int8-g32": rtn.quantize_int8_g32(w),
                "int4": rtn.quantize_int4(w, 32, False), "int4-sym-g128": rtn.quantize_int4(w, 128, True),
                "fp8": fpq.quantize_fp8(w), "fp8-e5m2-tensor": fpq.quantize_fp8(w, "e5m2", True),
                "mxfp8": fpq.quantize(w, "mxfp8"), "mxfp4": fpq.quantize(w, "mxfp4"), "nvfp4": fpq.quantize(w, "nvfp4")}

    w = torch.randn(1536, 1024, device=DEV)
    x = torch.randn(37, 1024, device=DEV)
    for name, t in formats(w).items():
        p = tq.pack(t)
        ref = x @ t.dequantize().T
        e32 = float((p(x) - ref).abs().max() / ref.abs().max())
        xb = x.bfloat16()
        refb = xb.float() @ t.dequantize().bfloat16().float().T
        eb = float((p(xb) - refb).abs().max() / refb.abs().max())
        alone = torch.equal(p(xb[5:6]), p(xb)[5:6]) and torch.equal(p(x[5:6]), p(x)[5:6])
        print(f"quant {name:16s} fp32 rel err {e32:.1e}  bf16 rel err {eb:.1e}  row alone == in batch: {alone}",
              flush=True)
    print(f"quant times on {torch.cuda.get_device_name()} (median ms; GB/s of weight bytes read at M=1)")
    for N, K in ((4096, 4096), (14336, 4096), (4096, 14336)):
        w = torch.randn(N, K, device=DEV) * 0.02
        wb = w.bfloat16()
        dq = {name: t for name, t in formats(w).items() if name in ("int8", "int4", "fp8", "mxfp4")}
        packs = {name: tq.pack(t) for name, t in dq.items()}
        for M in (1, 16, 256):
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            base = bench(lambda: F.linear(x, wb))
            line = [f"N={N} K={K} M={M:3d}: bf16 {base:.3f}"]
            for name, p in packs.items():
                ms = bench(lambda: p(x))
                gbs = f" {p.nbytes / ms / 1e6:.0f} GB/s" if M == 1 else ""
                line.append(f"{name} {ms:.3f} ({base / ms:.2f}x{gbs})")
                t = dq[name]
                ms = bench(lambda: F.linear(x, t.dequantize().to(x.dtype)))
                line.append(f"{name}/dequantize {ms:.3f} ({base / ms:.2f}x)")
            print("  ".join(line), flush=True)
            if M == 1:
                print(f"  wall us per call at M=1 (launch included): bf16 {wall(lambda: F.linear(x, wb)):.1f}  "
                      + "  ".join(f"{n} {wall(lambda p=p: p(x)):.1f}" for n, p in packs.items()), flush=True)


def flash(tmp: Path) -> None:
    from ridgeline.layers.attention_flash import varlen, varlen_reference
    torch.manual_seed(0)
    H, Hkv, D = 12, 4, 64
    n, start = [1, 37, 200, 5], [0, 100, 0, 300]  # queries, cached keys before them
    L = [a + b for a, b in zip(n, start)]
    cu_q = torch.tensor([0] + list(torch.tensor(n).cumsum(0)), dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0] + list(torch.tensor(L).cumsum(0)), dtype=torch.int32, device=DEV)
    q = torch.randn(sum(n), H, D, device=DEV, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(L), Hkv, D, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    for window in (None, 48):
        got = varlen(q, k, v, cu_q, cu_k, max(n), max(L), D ** -0.5, window).float()
        want = varlen_reference(q.float().cpu(), k.float().cpu(), v.float().cpu(), cu_q.cpu(), cu_k.cpu(), D ** -0.5,
                                window).to(DEV)
        print(f"flash kernel vs fp32 reference (prefix offsets, GQA 12/4, window {window}): max abs err "
              f"{float((got - want).abs().max()):.1e}", flush=True)
    prompts = ["shared system prompt, then a question " * 3 + str(i) for i in range(4)]
    prompts += ["a", "The quick brown fox " * 5]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=1)
    for arch in ("llama", "qwen2", "mistral"):
        folder = make_tiny_model(tmp / f"f-{arch}", arch)
        runs = {}
        for backend in ("flash", "sdpa"):
            llm = LLM(str(folder), dtype="bfloat16", device=DEV, kv_cache_memory="64MiB", max_num_batched_tokens=24,
                      attention_backend=backend, progress=False)
            outs = llm.generate(prompts, params, use_tqdm=False) + llm.generate(prompts[:2], params, use_tqdm=False)
            runs[backend] = [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outs]
        same = sum(a[0] == b[0] for a, b in zip(runs["flash"], runs["sdpa"]))
        first = [next((i for i, (x, y) in enumerate(zip(a[0], b[0])) if x != y), len(a[0]))
                 for a, b in zip(runs["flash"], runs["sdpa"])]
        diff = max(abs(x - y) for a, b in zip(runs["flash"], runs["sdpa"])
                   for i, (x, y) in enumerate(zip(a[1], b[1])) if i < min(first))
        print(f"flash {arch:8s} bf16: {same}/{len(first)} outputs identical to sdpa, first divergence at "
              f"{min(first)}; max |logprob diff| before it {diff:.2e}", flush=True)
    folder = make_tiny_model(tmp / "f-smol", "llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=16384,
                             vocab_size=49152)
    torch.manual_seed(0)
    for L in (2048, 8192):
        prompt = torch.randint(0, 256, (L,)).tolist()
        res = []
        for backend in ("sdpa", "flash", "sdpa", "flash"):
            llm = LLM(str(folder), dtype="bfloat16", device=DEV, kv_cache_memory="4GiB", max_num_batched_tokens=L,
                      max_model_len=L + 256, attention_backend=backend, enable_prefix_caching=False, progress=False)
            llm.generate([prompt[:64]], SamplingParams(max_tokens=2), use_tqdm=False)
            torch.cuda.synchronize()
            t = time.perf_counter()
            llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
            torch.cuda.synchronize()
            ttft = time.perf_counter() - t
            t = time.perf_counter()
            llm.generate([prompt], SamplingParams(max_tokens=129, ignore_eos=True), use_tqdm=False)
            torch.cuda.synchronize()
            dec = 128 / max(time.perf_counter() - t - ttft, 1e-9)
            res.append((backend, ttft, dec))
            del llm
            gc.collect()
            torch.cuda.empty_cache()
        for backend in ("sdpa", "flash"):
            r = [x for x in res if x[0] == backend]
            print(f"flash long context {L} tokens, {backend:5s}: prefill {min(x[1] for x in r) * 1e3:.1f} ms, "
                  f"decode {max(x[2] for x in r):.0f} tok/s (best of 2)", flush=True)


def engine(tmp: Path) -> None:
    from ridgeline.kernels import triton_quant
    folder = make_tiny_model(tmp / "e-400m", "llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                             num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                             vocab_size=32000, initializer_range=0.02)
    torch.manual_seed(0)
    prompts = [torch.randint(0, 256, (int(n),)).tolist() for n in torch.randint(50, 200, (64,))]
    greedy = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    teacher = SamplingParams(max_tokens=1, prompt_logprobs=1)

    def run(q):
        llm = LLM(str(folder), dtype="bfloat16", device=DEV, kv_cache_memory="2GiB", quantization=q, progress=False)
        out = [o.outputs[0].token_ids for o in llm.generate(prompts[:8], greedy, use_tqdm=False)]
        lps = torch.tensor([lp.logprob for o in llm.generate(prompts[:8], teacher, use_tqdm=False)
                            for lp in o.prompt_logprobs[1:]])
        return llm, out, lps

    def agree(a, b):
        return sum(x == y for s, t in zip(a, b) for x, y in zip(s, t)) / sum(map(len, b))

    def speed(llm):
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=128, ignore_eos=True), use_tqdm=False)
        torch.cuda.synchronize()
        b1 = 128 / (time.perf_counter() - t)
        t = time.perf_counter()
        llm.generate(prompts, greedy, use_tqdm=False)
        torch.cuda.synchronize()
        return b1, 64 * 64 / (time.perf_counter() - t)

    base, ref, ref_lp = run("none")
    del base
    gc.collect()
    torch.cuda.empty_cache()
    for q in ("none", "int8", "int4", "fp8", "mxfp4"):
        saved, triton_quant.HAS_TRITON = triton_quant.HAS_TRITON, False  # the torch path: dequantize per call
        try:
            fb, fb_out, fb_lp = run(q)
            fb_speed = speed(fb)
            del fb
            gc.collect()
            torch.cuda.empty_cache()
        finally:
            triton_quant.HAS_TRITON = saved
        llm, out, lp = run(q)
        b1, b64 = speed(llm)
        print(f"engine 0.4B {q:6s}: weights {llm.info.weight_bytes / 2**20:.0f} MiB; greedy agreement with bf16 "
              f"{agree(out, ref):.2f}, with the torch path of the same format {agree(out, fb_out):.2f}; "
              f"mean |prompt logprob diff| vs bf16 {float((lp - ref_lp).abs().mean()):.4f} "
              f"(torch path {float((fb_lp - ref_lp).abs().mean()):.4f}); batch 1 {b1:.0f} tok/s "
              f"(torch path {fb_speed[0]:.0f}), 64 requests {b64:.0f} out tok/s (torch path {fb_speed[1]:.0f})",
              flush=True)
        del llm
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    assert torch.cuda.is_available(), "needs a CUDA device"
    parts = sys.argv[1:] or ["quant", "flash", "engine"]
    with tempfile.TemporaryDirectory() as d:
        for part in parts:
            try:
                quant() if part == "quant" else (flash if part == "flash" else engine)(Path(d))
            except Exception as e:  # keep going: report and run the next part
                import traceback
                traceback.print_exc()
                print(f"{part}: ERROR {type(e).__name__}: {e}", flush=True)
