"""Build (once per machine, cached) and call the C skinny-matmul kernel in gemv.c through ctypes.

Used for one-to-eight-token batches on the CPU, where torch's bf16 GEMM is several times slower
than fp32 and fp32 `F.linear` streams weights at about half the memory bandwidth.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

MAX_M = 8
_SRC = Path(__file__).with_name("gemv.c")
_lib = None
_error: str | None = None


def _build() -> ctypes.CDLL:
    from ridgeline.utils.device import cpu_flags
    from ridgeline.weights.cache_dir import model_cache_dir

    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc) on PATH")
    src = _SRC.read_bytes()
    key = hashlib.sha256(src + " ".join(sorted(cpu_flags())).encode() + platform.machine().encode()).hexdigest()[:16]
    out = model_cache_dir() / "kernels" / f"gemv-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_so = Path(tmp) / out.name
            cmd = [cc, "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(_SRC), "-o", str(tmp_so)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"compiling {_SRC.name} failed: {proc.stderr.strip()[:500]}")
            os.replace(tmp_so, out)
    lib = ctypes.CDLL(str(out))
    lib.ridgeline_gemv.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    lib.ridgeline_gemv.restype = ctypes.c_int
    return lib


def available() -> bool:
    """True if the kernel is built and loadable here (built on first call)."""
    global _lib, _error
    if _lib is None and _error is None:
        try:
            _lib = _build()
        except (RuntimeError, OSError) as e:
            _error = str(e)
    return _lib is not None


def unavailable_reason() -> str | None:
    return _error


def gemv(x: torch.Tensor, w: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    """x [M, K] (any float dtype, M <= 8), w [N, K] contiguous bf16 or fp32 on the CPU -> [M, N] fp32."""
    M, K = x.shape
    N = w.shape[0]
    xf = x.to(torch.float32).contiguous()
    y = torch.empty(M, N, dtype=torch.float32)
    rc = _lib.ridgeline_gemv(w.data_ptr(), int(w.dtype == torch.bfloat16), xf.data_ptr(), y.data_ptr(),
                             M, N, K, threads or torch.get_num_threads())
    if rc:
        raise ValueError(f"gemv: M={M} out of range 1..{MAX_M}")
    return y
