"""Compile the C kernels in this folder into one shared library, keyed by their sources and this CPU.

Two places hold a build: the package itself (`_built/`, written when the package installs: setup.py's build
step calls `build_into_package`, and pip's output says what it builds) and the model cache (`kernels/`, a
fallback compiled at first use where the package holds no build for these sources on this CPU: a source
checkout edited since it was installed, or an installed package moved to a CPU with other features).

The key hashes every .c/.h file with the CPU's feature flags: `-march=native` code is only valid on a CPU
with the flags it was built for, and a library built from other sources never loads. Each translation unit
compiles in its own process (as many at once as there are cores), then one link; the result is renamed into
place, so a library is there whole or not at all.

This module imports nothing of the package (setup.py loads it by path, before the package's dependencies
are installed).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGED = HERE / "_built"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only", "-fPIC"]


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_family() -> int | None:
    """x86's `cpu family` (25: AMD Zen 3 and 4, 26: Zen 5), which tunings the compiler cannot tell apart
    (GCC 12 tunes all three as znver3) and kernels/weight_prefetch.h picks its prefetch distance by."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu family"):
                return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def flags() -> list[str]:
    """FLAGS, with the CPU family defined for the sources (RIDGELINE_CPU_FAMILY) where it is known."""
    fam = cpu_family()
    return FLAGS + ([f"-DRIDGELINE_CPU_FAMILY={fam}"] if fam is not None else [])


def sources() -> list[Path]:
    return sorted(HERE.glob("*.c"))


def key() -> str:
    """16 hex digits naming a library built from these sources with these flags for this CPU."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(HERE.glob("*.[ch]"))))
    digest.update((" ".join(sorted(cpu_flags())) + platform.machine()).encode())
    digest.update(" ".join(flags()).encode())
    return digest.hexdigest()[:16]


def library_name() -> str:
    return f"ridgeline-{key()}.so"


def packaged_library() -> Path | None:
    """The package's own build for these sources on this CPU, or None."""
    path = PACKAGED / library_name()
    return path if path.is_file() else None


def compiler() -> str:
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc) on PATH")
    return cc


def compile_library(out: Path, jobs: int | None = None) -> Path:
    """Build the library at `out` (objects compiled `jobs` at a time, default one per core); returns out."""
    cc = compiler()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        def one(src: Path) -> Path:
            obj = Path(tmp) / (src.stem + ".o")
            proc = subprocess.run([cc, *flags(), "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"compiling the C kernels failed ({src.name}): {proc.stderr.strip()[:500]}")
            return obj

        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            objs = list(pool.map(one, sources()))
        tmp_so = Path(tmp) / out.name
        proc = subprocess.run([cc, *flags(), "-shared", *map(str, objs), "-o", str(tmp_so), "-lm"],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"linking the C kernels failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp_so, out)
    return out


def build_into_package(root: Path | None = None, log=print) -> Path:
    """The install step: build this CPU's library into `<root>/ridgeline/kernels/_built/` (root: the build
    tree's package root; default this source tree), dropping builds for other sources. Returns its path."""
    target = (Path(root) / "ridgeline" / "kernels" / "_built") if root else PACKAGED
    name = library_name()
    if (target / name).is_file():  # these sources, this CPU: built by an earlier install
        log(f"ridgeline: the C kernels for this CPU are up to date ({target / name})")
        return target / name
    log(f"ridgeline: compiling the C kernels for this CPU ({len(sources())} files, {os.cpu_count()} at a time) "
        f"into {target / name}")
    t0 = time.perf_counter()
    compile_library(target / name)
    for old in target.glob("ridgeline-*.so"):
        if old.name != name:
            old.unlink()
    log(f"ridgeline: C kernels built in {time.perf_counter() - t0:.1f} s")
    return target / name


if __name__ == "__main__":  # python -m ridgeline.kernels.build: (re)build the package's own library
    build_into_package(log=lambda m: print(m, file=sys.stderr))
