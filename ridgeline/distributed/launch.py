"""One machine: rank 0 (the engine's own process) starts ranks 1..N-1 as `python -m
ridgeline.distributed.worker` processes, each pinned to its share of the cores, and watches them: a
rank that dies ends rank 0 within a second or so (in-flight requests failed first, through the
callbacks registered with `on_failure`), never a hang. Each worker watches rank 0 the same way."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

from ridgeline.distributed import wire, wire_types  # noqa: F401  (registers the config and RankContext)
from ridgeline.distributed.group import RankContext
from ridgeline.utils.internal_auth import env_with_secret

log = logging.getLogger(__name__)
EXIT_RANK_FAILED = 3
FAILURE_GRACE_S = 2.0  # callbacks get this long to fail requests before the process exits


class Workers:
    """Ranks 1..N-1 of a one-machine group, and the watchdog over them."""

    def __init__(self, config, contexts: list[RankContext], secret: bytes, what: str = "tensor-parallel rank"):
        """Each worker gets (config, its RankContext) on stdin in wire.py's codec, the launch's secret
        in its environment, and its end of the plan socket pair (ctx.plan_fd) as an inherited fd."""
        self.closing = False
        self.what = what  # how a rank is named in messages ("pipeline stage" for a pipeline)
        self.failed: str | None = None
        self.callbacks: list = []
        self.procs: list[subprocess.Popen] = []
        env = env_with_secret(secret)
        for ctx in contexts:
            env["OMP_NUM_THREADS"] = str(len(ctx.cores)) if ctx.cores else env.get("OMP_NUM_THREADS", "")
            p = subprocess.Popen([sys.executable, "-m", "ridgeline.distributed.worker"], stdin=subprocess.PIPE,
                                 env={k: v for k, v in env.items() if v != ""},
                                 pass_fds=() if ctx.plan_fd is None else (ctx.plan_fd,))
            p.stdin.write(wire.encode((config, ctx)))
            p.stdin.close()
            self.procs.append(p)
        for rank, p in enumerate(self.procs, start=1):
            threading.Thread(target=self._watch, args=(rank, p), daemon=True, name=f"rank{rank}-watch").start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def on_failure(self, callback) -> None:
        """callback(message) runs (on the watchdog thread) when a rank dies, before this process exits."""
        self.callbacks.append(callback)

    def dead(self) -> str | None:
        """Why the group is broken (a rank exited), or None: what a failed collective is blamed on."""
        for rank, p in enumerate(self.procs, start=1):
            if p.poll() is not None and not self.closing:
                return _why(self.what, rank, p)
        return self.failed

    def _watch(self, rank: int, p: subprocess.Popen) -> None:
        p.wait()
        if self.closing:
            return
        self.failed = message = _why(self.what, rank, p)
        log.error("%s; failing the requests in flight and exiting", message)
        print(f"ridgeline: {message}; exiting", file=sys.stderr, flush=True)
        done = threading.Event()

        def run_callbacks():
            for cb in self.callbacks:
                try:
                    cb(message)
                except Exception:
                    log.exception("rank-failure callback failed")
            done.set()
        threading.Thread(target=run_callbacks, daemon=True).start()
        done.wait(FAILURE_GRACE_S)
        time.sleep(0.5 if done.is_set() else 0)  # let failed responses reach their sockets
        for q in self.procs:
            if q.poll() is None:
                q.kill()
        os._exit(EXIT_RANK_FAILED)

    def close(self, timeout: float = 10.0) -> None:
        """After rank 0 told them to stop: wait for them, kill what does not exit."""
        self.closing = True
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _why(what: str, rank: int, p: subprocess.Popen) -> str:
    code = p.returncode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return f"{what} {rank} (pid {p.pid}) died ({how})"


def exit_soon(seconds: float) -> None:
    """Exit this process (EXIT_RANK_FAILED) after `seconds`, whatever its other threads are doing."""
    def later():
        time.sleep(seconds)
        print("ridgeline: the distributed group is broken; exiting", file=sys.stderr, flush=True)
        os._exit(EXIT_RANK_FAILED)
    threading.Thread(target=later, daemon=True, name="rank-failure-exit").start()


def watch_parent(interval: float = 0.5) -> None:
    """A follower exits (non-zero) when the process that started it is gone."""
    parent = os.getppid()

    def loop():
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                print(f"ridgeline: rank 0 (pid {parent}) is gone; worker {os.getpid()} exits", file=sys.stderr,
                      flush=True)
                os._exit(EXIT_RANK_FAILED)
    threading.Thread(target=loop, daemon=True, name="parent-watch").start()
