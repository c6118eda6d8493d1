"""Server processes a launcher starts and owns (data-parallel replicas, disaggregated workers): wait
until each answers its readiness route, and stop them all (SIGTERM, so each drains its requests, then
SIGKILL whatever is left after the grace period). One process that exits while starting fails the
start at once, naming it; none waits out the whole timeout for a child that is already gone."""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Sequence

import httpx

POLL_S = 0.2
STOP_GRACE_S = 30.0


def wait_ready(children: Sequence[tuple[subprocess.Popen, str]], route: str,
               headers: dict[str, str] | Sequence[dict[str, str]], timeout: float, names: Sequence[str],
               error: Callable[[str], Exception], hint: str = "") -> list[dict]:
    """Poll every child's url + route (with its headers: one dict for all, or one per child) until each
    answers 200; returns their JSON bodies in order.
    A child that exits raises error("NAME exited with code N while starting ..."); the deadline raises
    error("NAMES not ready after Ts" + hint)."""
    bodies: list[dict | None] = [None] * len(children)
    per_child = [headers] * len(children) if isinstance(headers, dict) else list(headers)
    deadline = time.monotonic() + timeout
    while any(b is None for b in bodies):
        for k, (proc, url) in enumerate(children):
            if bodies[k] is not None:
                continue
            if proc.poll() is not None:
                raise error(f"{names[k]} exited with code {proc.returncode} while starting (its log is above)")
            try:
                r = httpx.get(url + route, headers=per_child[k], timeout=2.0)
                if r.status_code == 200:
                    bodies[k] = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
            except (httpx.HTTPError, ValueError):
                pass
        waiting = [names[k] for k, b in enumerate(bodies) if b is None]
        if waiting and time.monotonic() > deadline:
            raise error(f"{', '.join(waiting)} not ready after {timeout:g}s{hint}")
        if waiting:
            time.sleep(POLL_S)
    return bodies


def stop_all(procs: Iterable[subprocess.Popen], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every child still running, wait up to grace seconds in all, SIGKILL what is left."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
