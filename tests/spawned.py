"""Helpers for tests that run `ridgeline serve` (or another server) as a child process: start it and
read the URL from its start-up line, stop it on the way out whatever happened, find its children."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

from server_helpers import SAFETY_S


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains and exits), then a kill if it has not exited within the safety timeout."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(SAFETY_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve(args: list[str], url_line: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`python -m ridgeline.cli serve *args`; yields (process, url) once a stdout line matches url_line,
    a pattern whose first group is the URL. Stopped on exit."""
    proc = subprocess.Popen([sys.executable, "-m", "ridgeline.cli", "serve", *args], stdout=subprocess.PIPE,
                            text=True)
    try:
        url = None
        for line in proc.stdout:
            m = re.search(url_line, line)
            if m:
                url = m.group(1)
                break
        assert url, f"the server did not start (exit code {proc.poll()})"
        yield proc, url
    finally:
        stop(proc)


def children(pid: int) -> list[int]:
    """The processes whose parent is pid (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out
