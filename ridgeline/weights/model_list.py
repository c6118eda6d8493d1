"""What the model cache holds, as `ridgeline list` shows it and `ridgeline rm` removes it: the pulled built-in
aliases' GGUF files (models/) and the converted folders beside them (converted/: config, tokenizer and a link
to their GGUF; a float copy of the weights only where a tool asked for one)."""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import InvalidRequestError
from ridgeline.weights.cache_dir import model_cache_dir
from ridgeline.weights.in_use import holders, live_records
from ridgeline.weights.pull import ALIASES, alias_path


@dataclass(frozen=True)
class CachedModel:
    name: str  # the alias, or the GGUF file a converted folder comes from
    path: Path
    size: int  # bytes on disk
    modified: float  # seconds since the epoch
    kind: str  # "pulled", "converted"
    note: str = ""  # "source missing", "float weights", the alias's description


def _in_use(path: Path, records: dict[int, list[str]]) -> list[str]:
    pids = holders(path, records)
    return [f"in use by process {', '.join(map(str, pids))}"] if pids else []


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def cached_models() -> list[CachedModel]:
    root = model_cache_dir()
    records = live_records()  # read once for the listing
    out = []
    for alias, a in sorted(ALIASES.items()):
        path = alias_path(alias)
        if path.is_file():
            out.append(CachedModel(alias, path, path.stat().st_size, path.stat().st_mtime, "pulled",
                                   ", ".join([a.description] + _in_use(path, records))))
    for folder in sorted((root / "converted").glob("*")):
        if not folder.is_dir():
            continue
        try:
            source = Path(json.loads((folder / "gguf-source.json").read_text())["gguf"])
        except (OSError, ValueError, KeyError, TypeError):
            source = None
        notes = []
        if source is None or not source.is_file():
            notes.append("source missing")
        if (folder / "model.safetensors").is_file():
            notes.append("float weights")
        notes += _in_use(folder, records)
        out.append(CachedModel(source.name if source is not None else folder.name, folder, _size(folder),
                               folder.stat().st_mtime, "converted", ", ".join(notes)))
    return out


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def table(models: list[CachedModel]) -> str:
    """One line per entry: name, kind, size, modified, path, notes."""
    if not models:
        return f"the model cache ({model_cache_dir()}) is empty; `ridgeline pull` fetches the default model"
    rows = [("NAME", "KIND", "SIZE", "MODIFIED", "PATH", "")]
    rows += [(m.name, m.kind, _human(m.size), time.strftime("%Y-%m-%d %H:%M", time.localtime(m.modified)), str(m.path),
              m.note) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths)).rstrip() + (f"  ({r[5]})" if r[5] else "")
                     for r in rows)


def remove(name: str, force: bool = False) -> list[Path]:
    """Remove an alias's pulled file and every converted folder of it, or the converted folders of a GGUF file
    name (`ridgeline list`'s NAME column); returns what was removed. Nothing outside the cache is touched, and
    nothing while a live process (a running `serve`, `generate`, `chat`) holds it, unless force."""
    models = cached_models()
    hits = [m for m in models if m.name == name or (name in ALIASES and m.name == alias_path(name).name)]
    if not hits:
        known = ", ".join(sorted({m.name for m in models})) or "nothing (the cache is empty)"
        raise InvalidRequestError(f"no cached model {name!r}; the cache holds {known}", "model")
    records = live_records()
    pids = sorted({pid for m in hits for pid in holders(m.path, records)})
    if pids and not force:
        raise InvalidRequestError(f"model {name!r} is in use by process {', '.join(map(str, pids))}; stop it first "
                                  "(or `ridgeline rm --force`)", "model")
    root = model_cache_dir().resolve()
    removed = []
    for m in hits:
        path = m.path.resolve()
        if root not in path.parents:  # never follow a link out of the cache
            continue
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(path)
    return removed
