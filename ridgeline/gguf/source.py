"""The link from a converted folder back to its GGUF file: the folder holds config and tokenizer only, and
its weights are read from the file in place (memory-mapped), never copied to disk as floats.

`gguf-source.json` names the file by its resolved path with the size and modification time it had when
the folder was made; a file that has moved or changed since is an error, not a silent mismatch. Reading
this link imports no GGUF code, so a Hugging Face folder's load pays nothing for it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ridgeline.errors import ModelLoadError

SOURCE_FILE = "gguf-source.json"


def write_source(folder: Path, gguf_path: Path) -> None:
    resolved = Path(gguf_path).resolve(strict=True)
    st = resolved.stat()
    link = {"gguf": str(resolved), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    (folder / SOURCE_FILE).write_text(json.dumps(link, indent=2) + "\n", encoding="utf-8")


def source_gguf(folder: Path) -> Path | None:
    """The GGUF file whose weights `folder` stands for, or None for an ordinary folder (or one converted
    with its weights written out, which loads from its safetensors)."""
    link = Path(folder) / SOURCE_FILE
    if not link.is_file() or any(Path(folder).glob("*.safetensors")):
        return None
    try:
        info = json.loads(link.read_text(encoding="utf-8"))
        path, size, mtime = Path(info["gguf"]), int(info["size"]), int(info["mtime_ns"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{link} is not a valid GGUF link ({e}); delete {folder} to convert again") from None
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelLoadError(f"{folder} reads its weights from {path}, which cannot be read now "
                             f"({e.strerror or e}); load the .gguf file itself") from None
    if (st.st_size, st.st_mtime_ns) != (size, mtime):
        raise ModelLoadError(f"{path} has changed since {folder} was made from it; load the .gguf file itself")
    return path
