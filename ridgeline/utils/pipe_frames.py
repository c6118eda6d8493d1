"""Length-prefixed JSON frames over a pipe between a process and its worker child: a 4-byte big-endian
length, then a UTF-8 JSON object; sizes checked before reading, reads bounded by a deadline. The
chat-template workers (weights/template_worker.py) and the grammar-compile worker
(structured/compile_worker.py) speak it over the child's stdin and stdout."""
from __future__ import annotations

import json
import os
import select
import struct
import time
from collections.abc import Callable

_HEADER = struct.Struct(">I")


class FrameTimeout(Exception):
    """The deadline passed before a whole frame arrived."""


def read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """n bytes from fd; FrameTimeout past the deadline, EOFError if the other side closed."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise FrameTimeout()
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the pipe")
        buf += chunk
    return bytes(buf)


def recv(fd: int, limit: int, deadline: float | None) -> dict:
    (size,) = _HEADER.unpack(read_exact(fd, _HEADER.size, deadline))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the limit of {limit}")
    value = json.loads(read_exact(fd, size, deadline))
    if not isinstance(value, dict):
        raise ValueError("a frame that is not a JSON object")
    return value


def frame(value: dict) -> bytes:
    data = json.dumps(value, ensure_ascii=False).encode("utf-8")
    return _HEADER.pack(len(data)) + data


def write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def child_output() -> int:
    """In a worker child: its frames' fd (a copy of stdout); stdout itself then goes to stderr, so anything
    printed never lands in the frames."""
    out = os.dup(1)
    os.dup2(2, 1)
    return out


def serve_jobs(out: int, limit: int, handle: Callable[[dict], bytes]) -> int:
    """In a worker child: each job frame from stdin (at most limit bytes) answered with handle's frame,
    until the parent closes the pipe (0)."""
    while True:
        try:
            job = recv(0, limit, None)
        except EOFError:  # the parent closed the pipe (or exited): done
            return 0
        write(out, handle(job))
