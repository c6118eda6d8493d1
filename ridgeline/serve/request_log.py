"""--log-requests FILE: append each accepted request body to FILE as one JSON line (the input of
`ridgeline cache-report`). Bodies are written as parsed (unknown fields kept), before any generation."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from pydantic import BaseModel

from ridgeline.errors import RidgelineError


class RequestLog:
    def __init__(self, path: str | Path):
        try:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed with the app)
        except OSError as e:
            raise RidgelineError(f"cannot open --log-requests file {path}: {e.strerror}") from None
        self._lock = threading.Lock()

    def write(self, body: BaseModel) -> None:
        line = json.dumps(body.model_dump(mode="json", exclude_unset=True), ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
