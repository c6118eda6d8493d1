"""`--hardware local`: measure this machine once (memory read bandwidth, matrix rates per precision,
one-token matmul streaming rate, the engine's matmul rate per row count, host cost per tensor op) and
cache the profile in the model cache dir.

Needs torch; everything else in the advisor does not. Best of a few repetitions, so a busy machine reads
closer to what it can do; absolute numbers still drift run to run on shared CPUs.
"""
from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path

from ridgeline.advisor.hardware import HardwareSpec
from ridgeline.weights.cache_dir import model_cache_dir

PROFILE_VERSION = 3
CURVE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU time (1 thread)


class _Timer:
    def __init__(self, clock: str, sync=lambda: None):
        self.clock, self.sync = CLOCKS[clock], sync

    def best(self, fn, reps: int) -> float:
        fn()
        self.sync()
        best = float("inf")
        for _ in range(reps):
            t = self.clock()
            fn()
            self.sync()
            best = min(best, self.clock() - t)
        return best


def _cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"model name\s*:\s*(.+)", text)
        if m:
            return m.group(1).strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _mem_total() -> float:
    from ridgeline.utils.device import meminfo_bytes
    return float(meminfo_bytes("MemTotal"))


def _matmul_rates(torch, dev, timer: _Timer, big: bool) -> dict[str, float]:
    """Dense GEMM rate per precision on a mid-size square-ish shape (not the model's)."""
    M, K, N = (8192, 8192, 8192) if big else (256, 2048, 2048)
    flop = 2 * M * K * N
    rates = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(M, K, device=dev, dtype=dt), torch.randn(N, K, device=dev, dtype=dt)
        rates[name] = flop / timer.best(lambda: torch.nn.functional.linear(a, b), 5)
    try:
        a = torch.randint(-64, 64, (M, K), device=dev, dtype=torch.int8)
        b = torch.randint(-64, 64, (K, N), device=dev, dtype=torch.int8)
        rates["int8"] = flop / timer.best(lambda: torch._int_mm(a, b), 5)
    except (RuntimeError, AttributeError):
        pass
    try:  # on a CPU this is an emulation: small shape so it stays quick
        m = M if big else 64
        a = torch.randn(m, K, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(N, K, device=dev).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=dev)
        rates["fp8"] = 2 * m * K * N / timer.best(
            lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 3)
    except (RuntimeError, AttributeError, TypeError):
        pass
    return rates


def _engine_gemm_curve(torch, timer: _Timer) -> dict[str, dict[int, float]]:
    """FLOP/s of the engine's matmul (ridgeline.layers.linear.matmul_fn, with the kernels the engine would
    pick for each precision) at CURVE_ROWS rows, on a set of weights larger than the caches: decode
    steps run at small M, where the CPU's GEMM is far below its peak and weight streaming dominates."""
    from ridgeline.layers.kernel_plan import choose_kernels
    from ridgeline.layers.linear import matmul_fn

    cpu, curve = torch.device("cpu"), {}
    N = K = 2048
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        plan = choose_kernels(cpu, dt, torch.float32)
        fns = [matmul_fn(torch.randn(N, K, dtype=dt), plan) for _ in range(16 // dt.itemsize)]  # 64 MiB: past the caches
        curve[name] = {}
        for m in CURVE_ROWS:
            x = torch.randn(m, K)
            t = timer.best(lambda: [f(x) for f in fns], 2)
            curve[name][m] = 2 * m * N * K * len(fns) / t
        del fns
    return curve


def measure(device: str = "auto", clock: str = "wall") -> dict:
    import torch

    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    gpu = dev.type == "cuda"
    clock = "wall" if gpu else clock
    timer = _Timer(clock, torch.cuda.synchronize if gpu else (lambda: None))
    n = (1 << 29) if gpu else (1 << 26)  # 2 GiB on a GPU, 256 MiB on a CPU: far past the caches
    x = torch.ones(n, device=dev)
    bandwidth = x.numel() * 4 / timer.best(lambda: x.sum(), 5)
    del x
    stream = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        ws = [torch.randn(2048, 2048, device=dev, dtype=dt) for _ in range(32 if gpu else 16)]
        v = torch.randn(1, 2048, device=dev, dtype=dt)
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        forms = {"F.linear": lambda: [torch.nn.functional.linear(v, w) for w in ws],
                 "mul+sum": lambda: [(w * v).sum(-1) for w in ws]}
        stream[name] = max(nbytes / timer.best(f, 3) for f in forms.values())
        del ws
    tiny = torch.ones(8, device=dev)
    reps = 2000
    op = timer.best(lambda: [torch.add(tiny, tiny) for _ in range(reps)], 3) / reps
    props = torch.cuda.get_device_properties(dev) if gpu else None
    return {"version": PROFILE_VERSION, "name": f"local {props.name if gpu else _cpu_name()}",
            "kind": "gpu" if gpu else "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
            "memory": float(props.total_memory) if gpu else _mem_total(), "bandwidth": bandwidth,
            "flops": _matmul_rates(torch, dev, timer, gpu), "weight_stream_bw": stream, "op_overhead": op,
            "gemm_curve": {} if gpu else _engine_gemm_curve(torch, timer),
            "clock": clock, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def _cache_path(device: str, clock: str) -> Path:
    import torch

    what = "cuda" if device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
    key = f"{_cpu_name()}-{what}-{torch.get_num_threads()}t-{clock}-{torch.__version__}"
    return model_cache_dir() / "advisor" / f"profile-{re.sub(r'[^A-Za-z0-9.]+', '_', key)}.json"


def to_spec(p: dict) -> HardwareSpec:
    name = p["name"] + f" ({p['threads']} threads)" * (p["kind"] == "cpu")
    return HardwareSpec(name, p["kind"], p["memory"], p["bandwidth"], dict(p["flops"]),
                        weight_stream_bw=dict(p["weight_stream_bw"]), op_overhead=p["op_overhead"],
                        gemm_curve={k: {int(m): r for m, r in v.items()} for k, v in p.get("gemm_curve", {}).items()},
                        source=f"measured {p['measured_at']} ({p['clock']} clock), torch {p['torch']}")


def cached_profile(device: str = "auto", clock: str = "wall") -> dict | None:
    """The measured profile of this machine if one is cached (never measures)."""
    path = _cache_path(device, clock)
    try:
        p = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return p if p.get("version") == PROFILE_VERSION else None


def local_hardware(refresh: bool = False, device: str = "auto", clock: str = "wall",
                   verbose: bool = True) -> HardwareSpec:
    import sys

    path = _cache_path(device, clock)
    if not refresh and path.exists():
        try:
            p = json.loads(path.read_text())
            if p.get("version") == PROFILE_VERSION:
                return to_spec(p)
        except (json.JSONDecodeError, KeyError):
            pass
    if verbose:
        print("measuring this machine (memory bandwidth, matmul rates); cached in " + str(path), file=sys.stderr)
    p = measure(device, clock)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(p, indent=1))
    return to_spec(p)
