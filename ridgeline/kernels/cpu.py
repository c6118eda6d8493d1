"""Load the C kernels in this folder through ctypes (built when the package installs, else once per machine
into the model cache: build.py).

gemm_packed.c: matmul against weights repacked at load time (AVX-512 fp32, AVX512-BF16 bf16), for
every batch size; torch's CPU GEMM reads weights slowly at small M and runs below peak at large M.
gemv.c: skinny matmul for 1-8 token batches on CPUs without it. paged_attention.c: attention read
straight from the paged KV cache in any KV format (kv_quant.h), split across threads along the keys,
where gather + SDPA costs a copy and a large fixed overhead; paged_prefill.c: the same for prefill
rows as query x key tiles with the online softmax (the entry the layers call).
ops.c: fused element-wise layer steps (RMSNorm + residual, SiLU-and-multiply, rotary + quantizing KV write).
gemm_int8.c, gemm_int8_g32.c, gemm_int4.c: weight-only matmul against int8 (per channel, or an fp16 scale
per 32 k: GGUF Q8_0's grid) and group-wise int4 weights, packed at load time like gemm_packed.c's.
gemm_a8.c: the same weights against activations quantized to int8 per row (W8A8, W4A8), with VNNI integer
dot products. gemm_fp8.c: fp8 / MXFP8 weights converted to fp32 in registers; gemm_fp4.c: MXFP4 / NVFP4
weights by table lookup into int8 lanes against int8 activations (VNNI).
decoder_stack.c: every layer of a step through the kernels above in one call from Python.
eagle_draft.c: an EAGLE head's step (fc, then its layer through decoder_stack.c), its draft decision
(its LM-head rows, softmax top, copy-pointer mixture), and a greedy chain of the two in one call.
moe.c: a sparse MLP's routing and grouped per-expert matmuls (module path and decoder stack alike).
"""
from __future__ import annotations

import ctypes
import sys
import time

_lib: ctypes.CDLL | None = None
_error: str | None = None

_I64, _PTR, _INT, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "ridgeline_gemv": [_PTR, _INT, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_packed_available": [_INT],
    "ridgeline_packed_cols": [],
    "ridgeline_pack_f32": [_PTR, _PTR, _I64, _I64],
    "ridgeline_pack_bf16": [_PTR, _PTR, _I64, _I64],
    "ridgeline_gemm_f32p": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_bf16p": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_int8_available": [],
    "ridgeline_int4_available": [],
    "ridgeline_pack_i8": [_PTR, _PTR, _I64, _I64],
    "ridgeline_pack_i8_gemm": [_PTR, _PTR, _I64, _I64],
    "ridgeline_int8_bf16": [],
    "ridgeline_i8g32_activations": [],
    "ridgeline_pack_i4": [_PTR, _PTR, _I64, _I64],
    "ridgeline_gemm_i8p": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_i8g32": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_i4p": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _INT],
    "ridgeline_pack_i5_high": [_PTR, _PTR, _I64, _I64],
    "ridgeline_pack_i5": [_PTR, _PTR, _I64, _I64],
    "ridgeline_gemm_i5p": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT, _INT],
    "ridgeline_pack_i6_high": [_PTR, _PTR, _I64, _I64],
    "ridgeline_pack_i6": [_PTR, _PTR, _I64, _I64],
    "ridgeline_gemm_i6p": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_iq4_available": [],
    "ridgeline_gemm_i4k": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_i5k": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_kq": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_iq4": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT],
    "ridgeline_a8_available": [],
    "ridgeline_pack_w8a8": [_PTR, _PTR, _I64, _I64],
    "ridgeline_gemm_w8a8": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_w8a8_g32": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_gemm_w4a8": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT, _INT],
    "ridgeline_fp8_available": [],
    "ridgeline_fp4_available": [],
    "ridgeline_gemm_fp8": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT, _INT],
    "ridgeline_gemm_fp4": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT],
    "ridgeline_stack_fields": [_INT],
    "ridgeline_stack_weight_format": [_I64],
    "ridgeline_stack_kv_format": [_I64],
    "ridgeline_stack_scratch": [_PTR, _I64],
    "ridgeline_stack_profile": [_PTR],
    "ridgeline_decoder_stack": [_PTR, _F32, _F32, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _INT, _I64, _PTR, _PTR,
                                _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _INT],
    "ridgeline_lora_add": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT],
    "ridgeline_lora_fields": [_INT],
    "ridgeline_moe_fields": [],
    "ridgeline_moe_scratch": [_PTR, _I64, _I64],
    "ridgeline_moe": [_PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _I64, _INT],
    "ridgeline_moe_route": [_PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _INT],
    "ridgeline_moe_experts": [_PTR, _PTR, _PTR, _PTR, _I64, _PTR, _INT],
    "ridgeline_moe_combine": [_PTR, _PTR, _PTR, _I64, _PTR, _I64, _I64],
    "ridgeline_moe_shared": [_PTR, _PTR, _PTR, _I64, _I64, _PTR, _INT],
    "ridgeline_rmsnorm": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32, _INT],
    "ridgeline_silu_mul": [_PTR, _PTR, _I64, _I64, _INT],
    "ridgeline_gelu_tanh_mul": [_PTR, _PTR, _I64, _I64, _INT],
    "ridgeline_swiglu_clamp_mul": [_PTR, _PTR, _I64, _I64, _F32, _F32, _INT],
    "ridgeline_embed": [_PTR, _INT, _PTR, _I64, _I64, _I64, _PTR],
    "ridgeline_linear_argmax": [_PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _INT, _INT],
    "ridgeline_td_last_live_groups": [],
    "ridgeline_eagle_step": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _F32, _F32, _PTR, _PTR,
                             _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _INT],
    "ridgeline_draft_pick": [_PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _F32,
                             _PTR, _F32, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _INT],
    "ridgeline_chain_fields": [_INT],
    "ridgeline_eagle_chain": [_PTR, _PTR, _PTR, _PTR, _PTR, _INT],
    "ridgeline_copy_rows": [_PTR, _PTR, _PTR, _PTR, _I64, _I64],
    "ridgeline_qk_norm": [_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _F32, _INT],
    "ridgeline_rope_kv": [_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _INT, _PTR, _INT],
    "ridgeline_paged_decode": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _INT, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64,
                               _I64, _I64, _F32, _F32, _PTR, _INT],
    "ridgeline_paged_decode_q_rounding": [_INT, _I64],
    "ridgeline_paged_attention": [_PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _INT, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64,
                                  _I64, _I64, _I64, _I64, _F32, _F32, _PTR, _INT],
}

_RESTYPES = {"ridgeline_stack_scratch": _I64, "ridgeline_moe_scratch": _I64, "ridgeline_copy_rows": None,
             "ridgeline_td_last_live_groups": _I64}


def _build() -> ctypes.CDLL:
    from ridgeline.kernels import build
    from ridgeline.kernels.formats import stale_header
    from ridgeline.weights.cache_dir import model_cache_dir

    stale = stale_header()  # the C side's format codes are the Python table's, or nothing is built
    if stale:
        raise RuntimeError(stale)
    out = build.packaged_library()  # built when the package installed
    if out is None:  # sources edited since, or another CPU: compiled once into the model cache
        out = model_cache_dir() / "kernels" / build.library_name()
        if not out.exists():
            t0 = time.perf_counter()
            print(f"compiling the C kernels for this CPU into {out.parent} (once; the package holds no build of "
                  "these sources for this CPU) ...", file=sys.stderr, flush=True)
            build.compile_library(out)
            print(f"C kernels built in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    lib = ctypes.CDLL(str(out))
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, _RESTYPES.get(name, ctypes.c_int)
    return lib


def lib() -> ctypes.CDLL | None:
    """The loaded library, built on first call; None (see unavailable_reason) if it cannot be."""
    global _lib, _error
    if _lib is None and _error is None:
        try:
            _lib = _build()
        except (RuntimeError, OSError) as e:
            _error = str(e)
    return _lib


def unavailable_reason() -> str | None:
    return _error
