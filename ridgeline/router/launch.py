"""Start N replicas of one model on this machine as processes, each on a loopback socket the parent
binds on a port the OS picks (so two servers on one host never collide) and with its KV events on an
ipc:// socket in a private folder, and split the CPU cores between them. A replica's spec, its API
key included, reaches it over its stdin, never its command line (which any local user can read).

A replica is the OpenAI server, an entry point: each process runs the program REPLICA_MAIN
(serve/replica_main.py) as `python -m REPLICA_MAIN FD`; this module starts it, never imports it."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


from ridgeline.errors import RidgelineError
from ridgeline.http.front_limits import auth_headers
from ridgeline.http.server import bind, url_of
from ridgeline.utils.child_servers import stop_all, wait_ready
from ridgeline.utils.cpus import available_cpus, core_shares

START_TIMEOUT_S = 600.0  # loading a large model takes a while; a process that exits fails at once
REPLICA_MAIN = "ridgeline.serve.replica_main"  # the program one replica process runs (FD, then its spec on stdin)


def _hand_over(proc: subprocess.Popen, spec: dict) -> None:
    """Write the spec to the child's stdin and close it; a child already gone is found by wait_ready."""
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(json.dumps(spec).encode())
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.close()


@dataclass
class ReplicaProcess:
    index: int
    url: str
    process: subprocess.Popen
    api_key: str | None = None

    def exit_code(self) -> int | None:
        return self.process.poll()


@dataclass
class Spare:
    """A replica process started ahead of its spec (one replica's share: every core): it imports what a
    replica needs, then waits on stdin; `ProcessLauncher.start(..., spare=)` hands it a spec."""
    url: str
    process: subprocess.Popen
    threads: int
    cpus: list[int]

    def stop(self) -> None:
        stop_all([self.process], 5.0)


def _spawn(threads: int) -> tuple[str, subprocess.Popen]:
    sock = bind("127.0.0.1", 0)
    url = url_of(sock)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    # the spec (its key included) goes over stdin: a command line is readable by any local user
    proc = subprocess.Popen([sys.executable, "-m", REPLICA_MAIN, str(sock.fileno())],
                            pass_fds=[sock.fileno()], env=env, stdin=subprocess.PIPE)
    sock.close()  # the child holds its own copy
    return url, proc


def spare() -> Spare:
    cpus = core_shares(1)[0]
    threads = len(cpus) or len(available_cpus())
    url, proc = _spawn(threads)
    return Spare(url, proc, threads, cpus)


class ProcessLauncher:
    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="ridgeline-dp-")
        self.replicas: list[ReplicaProcess] = []

    def start(self, specs: list[dict], kv_events: bool = True, spare: Spare | None = None) -> list[ReplicaProcess]:
        """spare: a process started ahead for the one spec (its imports done), or None."""
        shares = core_shares(len(specs))
        total = len(available_cpus())
        for i, spec in enumerate(specs):
            if spare is not None and len(specs) == 1 and spare.process.poll() is None:
                url, proc, threads, cpus = spare.url, spare.process, spare.threads, spare.cpus
            else:
                threads, cpus = len(shares[i]) or max(1, total // len(specs)), shares[i]
                url, proc = _spawn(threads)
            events = f"ipc://{self.folder}/replica-{i}.kv" if kv_events else None
            spec = {**spec, "index": i, "threads": threads, "cpus": cpus, "parent": os.getpid(),
                    "settings": {**spec["settings"], "kv_events_endpoint": events}}
            self.replicas.append(ReplicaProcess(i, url, proc, spec["settings"].get("api_key")))
            _hand_over(proc, spec)
        self.wait_ready()
        return self.replicas

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        rs = self.replicas
        try:
            wait_ready([(r.process, r.url) for r in rs], "/health", [auth_headers(r.api_key) for r in rs], timeout,
                       [f"replica {r.index}" for r in rs], RidgelineError)
        except RidgelineError:
            self.stop()
            raise

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (each replica drains), then SIGKILL what is left after timeout."""
        stop_all((r.process for r in self.replicas), timeout)
        shutil.rmtree(self.folder, ignore_errors=True)

    def exit_reason(self, url: str) -> str | None:
        """Why the replica at url is gone (its process exited), or None while it runs."""
        for r in self.replicas:
            if r.url == url and r.exit_code() is not None:
                return f"its process exited with code {r.exit_code()}"
        return None
