"""Which processes hold a cached model. A process that resolves a model out of the model cache records its pid
and the cache paths it reads (in-use/<pid>.json under the cache, removed at exit); `ridgeline rm` refuses a model a
live process holds. A record whose process is gone (killed, crashed) is stale and ignored."""
from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

from ridgeline.weights.cache_dir import model_cache_dir

_registered = False


def _record(pid: int) -> Path:
    return model_cache_dir() / "in-use" / f"{pid}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _read(path: Path) -> list[str]:
    try:
        paths = json.loads(path.read_text())["paths"]
        return [str(p) for p in paths] if isinstance(paths, list) else []
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _forget() -> None:
    try:
        _record(os.getpid()).unlink()
    except OSError:
        pass


def mark(*paths: Path | None) -> None:
    """Record that this process reads these paths (those inside the model cache; others are the user's)."""
    global _registered
    root = model_cache_dir().resolve()
    held = {str(r) for r in (p.resolve() for p in paths if p is not None) if root in r.parents}
    if not held:
        return
    record = _record(os.getpid())
    record.parent.mkdir(parents=True, exist_ok=True)
    held |= set(_read(record))
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "paths": sorted(held)}))
    tmp.replace(record)
    if not _registered:
        atexit.register(_forget)
        _registered = True


def live_records() -> dict[int, list[str]]:
    """pid -> the paths it holds, for every live process other than this one."""
    folder = model_cache_dir() / "in-use"
    out = {}
    for record in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            pid = int(record.stem)
        except ValueError:
            continue
        if pid != os.getpid() and _alive(pid):
            out[pid] = _read(record)
    return out


def holders(path: Path, records: dict[int, list[str]] | None = None) -> list[int]:
    """The live processes other than this one whose records (live_records() unless given) hold path, or a path
    under it."""
    target = path.resolve()
    return [pid for pid, paths in (live_records() if records is None else records).items()
            if any(Path(p) == target or target in Path(p).parents for p in paths)]
