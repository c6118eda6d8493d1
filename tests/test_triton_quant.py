"""The CUDA quantized-weight kernel (kernels/triton_quant.py) run on a CPU under Triton's
interpreter: every packed format equals the dequantize-then-matmul reference, every fp8 code decodes
to its value, split-K and ragged tiles included, and a row's result does not depend on the rows
beside it, and an engine whose quantized layers run it gives the torch path's output. A subprocess,
since the interpreter is chosen when the kernel is defined."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ridgeline.kernels import triton_quant

SCRIPT = textwrap.dedent("""
    import torch
    from ridgeline.kernels import triton_quant as tq
    from ridgeline.formats import fpq, rtn
    torch.manual_seed(0)
    N, K = 72, 1024  # N not a multiple of the 64-column tile; K split four ways
    assert tq.split_k(N, K) > 1
    w, x = torch.randn(N, K), torch.randn(5, K)
    cases = {"int8": rtn.quantize_int8(w), "int8-g32": rtn.quantize_int8_g32(w),
             "int4": rtn.quantize_int4(w, 32, False), "int4-sym-g128": rtn.quantize_int4(w, 128, True),
             "fp8": fpq.quantize_fp8(w), "fp8-e5m2-tensor": fpq.quantize_fp8(w, "e5m2", True),
             "mxfp8": fpq.quantize(w, "mxfp8"), "mxfp4": fpq.quantize(w, "mxfp4"), "nvfp4": fpq.quantize(w, "nvfp4")}
    for name, t in cases.items():
        p = tq.pack(t)
        y, ref = p(x), x @ t.dequantize().T
        err = float((y - ref).abs().max() / ref.abs().max())
        assert err < 1e-5, (name, err)
        assert torch.equal(p(x[2:3]), y[2:3]), name  # alone or beside four others: the same bits
        assert p.nbytes < w.numel() * 2, name
    w, x = torch.randn(40, 96), torch.randn(3, 96)  # K below one tile and not a power of two
    for t in (rtn.quantize_int8(w), rtn.quantize_int4(w, 32, True), fpq.quantize(w, "mxfp4"), fpq.quantize_fp8(w)):
        ref = x @ t.dequantize().T
        assert float((tq.pack(t)(x) - ref).abs().max() / ref.abs().max()) < 1e-5, type(t).__name__
    codes = torch.arange(256, dtype=torch.uint8)
    for dt, elem in ((torch.float8_e4m3fn, tq.FP8_E4M3), (torch.float8_e5m2, tq.FP8_E5M2)):
        vals = codes.view(dt).float()
        ok = torch.isfinite(vals)
        n = int(ok.sum())
        one = tq.TritonWeight(codes[ok].view(1, n).contiguous(), torch.ones(1, 1), None, elem, 0, n, 1, n)
        assert torch.equal(one(torch.eye(n))[:, 0], vals[ok]), dt
    # a whole engine with its quantized layers on the kernel (the C kernels switched off) against the
    # torch path (dequantize per call): the same greedy tokens, logprobs within float rounding
    import sys, tempfile
    from pathlib import Path
    sys.path.insert(0, "tests")
    from conftest import make_tiny_model
    from ridgeline import LLM, SamplingParams
    from ridgeline.layers.int_formats import QuantizedFormat
    QuantizedFormat.runs_kernel = lambda self, w: False
    folder = make_tiny_model(Path(tempfile.mkdtemp()) / "m", "llama")
    # every kernel call inside the engine checked against the dequantized weight on the very input it
    # got (its rounded activations): the wiring exactly, whatever the rounding does between layers
    made, checked, real_pack, real_call = {}, [0], tq.pack, tq.TritonWeight.__call__
    def pack(t):
        w = real_pack(t)
        made[id(w)] = t
        return w
    def call(self, x):
        y = real_call(self, x)
        ref = x.float() @ made[id(self)].dequantize().T
        assert float((y - ref).abs().max() / ref.abs().max()) < 1e-5, "engine call"
        checked[0] += 1
        return y
    tq.pack, tq.TritonWeight.__call__ = pack, call
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    for q in ("int4", "nvfp4"):
        runs = []
        for on in (True, False):
            tq.HAS_TRITON = on
            llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", quantization=q, progress=False)
            packed = llm.engine.runner.model.model.layers[0].self_attn.o_proj.packed
            assert isinstance(packed, tq.TritonWeight) == on, q
            runs.append([(c.token_ids, [lp.logprob for lp in c.logprobs])
                         for o in llm.generate(["Hello there", "The quick brown fox"], params, use_tqdm=False)
                         for c in o.outputs])
        # int4 is weight-only: the two sums differ by float rounding. nvfp4 rounds each layer's
        # input to int8 blocks, and a one-ulp difference between the kernel's sum and torch's (whose
        # order depends on the CPU's BLAS) can move a rounded input by a code: a few hundredths of a
        # logprob on this random model, where a wrongly wired kernel gives another distribution
        tol = 1e-4 if q == "int4" else 0.1
        assert checked[0] > 0, q
        checked[0] = 0
        for (a, la), (b, lb) in zip(*runs):
            assert a == b and max(abs(x - y) for x, y in zip(la, lb)) < tol, q
    print("ok")
""")


def test_triton_kernel_matches_the_reference_under_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_where_the_kernel_cannot_run_the_reason_is_named(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_quant, "HAS_TRITON", False)
    assert "no triton" in triton_quant.unavailable_reason(torch.device("cuda"))
    assert not triton_quant.available(torch.zeros(2))
    if not torch.cuda.is_available():
        monkeypatch.setattr(triton_quant, "HAS_TRITON", True)
        assert "compute capability 8.0" in triton_quant.unavailable_reason(torch.device("cuda"))
        assert not triton_quant.available(torch.zeros(2))  # a CPU tensor, no interpreter
