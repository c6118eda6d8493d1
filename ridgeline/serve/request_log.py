"""--log-requests FILE: append each accepted request body to FILE as one JSON line (the input of
`ridgeline cache-report`). Bodies are written as parsed (unknown fields kept), before any generation.

Prompts are users' data: a new FILE is created readable by its owner only (0600), and an existing one
keeps the permissions it has (never widened)."""
from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

from pydantic import BaseModel

from ridgeline.errors import RidgelineError

log = logging.getLogger(__name__)


class RequestLog:
    def __init__(self, path: str | Path):
        try:  # the mode applies only when the file is created
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as e:
            raise RidgelineError(f"cannot open --log-requests file {path}: {e.strerror}") from None
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode) and mode & 0o077:
            log.warning("--log-requests file %s is readable or writable by others (mode %o); it records every "
                        "prompt: chmod 600 it", path, mode)
        self._file = os.fdopen(fd, "a", encoding="utf-8")  # closed with the app
        self._lock = threading.Lock()

    def write(self, body: BaseModel) -> None:
        line = json.dumps(body.model_dump(mode="json", exclude_unset=True), ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
