"""`ridgeline serve --disaggregate xPyD`: start x prefill and y decode worker processes on this
machine (each `ridgeline serve --role ...` on a free local port, with the same model and engine
flags), wait until each answers /disagg/info, check them as a set, and serve the front on
--host/--port until a signal; the workers end with it. The workers take a key made for this launch
(by environment, never on their command line), which only the front holds; clients meet the front's
own guard (--api-key, the body and connection limits). The workers' internal channels (KV
connectors, prefill endpoints, on loopback) share the deployment's secret, handed to each worker by
environment too.

Cores: each worker is pinned to its own contiguous share of this process's cores (as equal as they
divide) with as many threads, so a prefill never takes a core from a decode step; with more workers
than cores, or --no-pin-cores, they share them with cores / (x + y) threads each (at least 1)."""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys


from ridgeline.disagg.front import DisaggConfigError, Front, Worker, build_front
from ridgeline.http.front_limits import FrontLimits, auth_headers, front_limits, new_api_key
from ridgeline.utils.api_key_env import env_with_api_key
from ridgeline.http.transport import guarded_protocol
from ridgeline.utils import internal_auth
from ridgeline.utils.child_servers import stop_all, wait_ready

_XPYD = re.compile(r"^(\d+)P(\d+)D$", re.IGNORECASE)
ENGINE_GROUP = "engine"


def parse_xpyd(text: str) -> tuple[int, int]:
    m = _XPYD.match(text.strip())
    if m is None:
        raise DisaggConfigError(f"--disaggregate takes xPyD (x prefill and y decode workers), e.g. 1P1D or 2P1D; "
                                f"got {text!r}")
    x, y = int(m.group(1)), int(m.group(2))
    if x == 0:
        raise DisaggConfigError(f"--disaggregate {text}: a decode worker needs a prefill worker; give 1P or more")
    if y == 0:
        raise DisaggConfigError(f"--disaggregate {text}: prefill workers need a decode worker; give 1D or more")
    if x + y > 64:
        raise DisaggConfigError(f"--disaggregate {text}: at most 64 workers on one machine")
    return x, y


def engine_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The engine flags of `args` that differ from their defaults, as command-line arguments."""
    out: list[str] = []
    group = next(g for g in parser._action_groups if g.title == ENGINE_GROUP)  # noqa: SLF001
    for action in group._group_actions:  # noqa: SLF001
        value = getattr(args, action.dest)
        if value == action.default or not action.option_strings or action.dest == "model":
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:  # a switch: store_true / store_false
            out.append(flag)
        else:
            out += [flag, str(value)]
    return out


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def placement(n: int, pin: bool, cpus: list[int] | None = None) -> list[tuple[list[int], int]]:
    """(cores to pin to, [] for none; threads) of each of n workers."""
    from ridgeline.utils.cpus import core_shares

    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    shares = core_shares(n, cpus) if pin else [[] for _ in range(n)]
    return [(share, len(share) or max(1, len(cpus) // n)) for share in shares]


def describe_placement(x: int, places: list[tuple[list[int], int]], pin: bool) -> str:
    if not places[0][0]:
        why = "--no-pin-cores" if not pin else f"{len(places)} workers, fewer cores"
        return f"cores     not pinned ({why}): the workers share the cores, {places[0][1]} thread(s) each"
    names = [f"prefill {i + 1}" for i in range(x)] + [f"decode {i + 1}" for i in range(len(places) - x)]
    return "cores     " + "; ".join(f"{n}: cpu {_ranges(cores)}, {t} thread{'s' if t > 1 else ''}"
                                    for n, (cores, t) in zip(names, places))


def _ranges(cores: list[int]) -> str:
    return f"{cores[0]}" if len(cores) == 1 else f"{cores[0]}-{cores[-1]}" if cores == list(
        range(cores[0], cores[-1] + 1)) else ",".join(map(str, cores))


def _spawn(model: str, flags: list[str], role: str, args, place: tuple[list[int], int],
           worker_key: str, secret: bytes) -> tuple[subprocess.Popen, str]:
    port = _free_port("127.0.0.1")
    argv = [sys.executable, "-m", "ridgeline.cli", "serve", model, *flags, "--role", role, "--host", "127.0.0.1",
            "--port", str(port), "--kv-connector", args.kv_connector,
            "--kv-transfer-timeout", str(args.kv_transfer_timeout), "--quiet",
            # a body the front took, re-encoded as ASCII JSON (up to 3x: an emoji is 12 bytes escaped)
            "--max-body-bytes", str(3 * args.max_body_bytes + (64 << 10)),
            "--kv-inbox-size", str(args.kv_inbox_size), "--internal-max-connections", str(args.internal_max_connections)]
    if args.served_model_name:
        argv += ["--served-model-name", args.served_model_name]
    cores, threads = place
    # the workers' key ($RIDGELINE_API_KEY, which the worker reads and drops) and the secret by environment, never argv
    env = internal_auth.env_with_secret(secret, env_with_api_key(worker_key, {**os.environ, "OMP_NUM_THREADS": str(threads)}))
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None  # in the child, before it starts a thread
    return subprocess.Popen(argv, env=env, preexec_fn=pin), f"http://127.0.0.1:{port}"


def _wait_ready(procs: list[tuple[subprocess.Popen, str]], timeout: float, worker_key: str) -> list[dict]:
    return wait_ready(procs, "/disagg/info", auth_headers(worker_key), timeout, [f"the worker at {u}" for _, u in procs],
                      DisaggConfigError, " (--worker-start-timeout)")


def _stop(procs: list[tuple[subprocess.Popen, str]]) -> None:
    stop_all(p for p, _ in procs)


def front_server(app, limits: FrontLimits):
    import uvicorn

    from ridgeline.http.server import SignalServer

    class FrontServer(SignalServer):
        """A signal ends the front and returns (uvicorn would re-raise it, killing this process before its
        workers are stopped); a second one ends it at once."""

        def _on_signal(self, sig, frame) -> None:
            self.force_exit = self.should_exit
            self.should_exit = True

    return FrontServer(uvicorn.Config(app, log_level="warning", timeout_keep_alive=5,
                                      http=guarded_protocol(limits.timeout_header, limits.max_connections)))


def launch(args: argparse.Namespace, parser: argparse.ArgumentParser, model: str) -> int:
    from ridgeline.http.server import bind, url_of

    x, y = parse_xpyd(args.disaggregate)
    sock = bind(args.host, args.port)  # before starting anything: a busy port fails at once
    pin = getattr(args, "pin_cores", True)
    places = placement(x + y, pin)
    print(describe_placement(x, places, pin), flush=True)
    flags = engine_flags(parser, args)
    worker_key = new_api_key()  # the workers take requests from this front only
    secret = internal_auth.deployment_secret(args.internal_secret_file)  # their internal channels
    procs = [_spawn(model, flags, "prefill" if i < x else "decode", args, place, worker_key, secret)
             for i, place in enumerate(places)]
    try:
        infos = _wait_ready(procs, args.worker_start_timeout, worker_key)
        workers = [Worker(url, info) for (_, url), info in zip(procs, infos)]
        front = Front(workers[:x], workers[x:], worker_key=worker_key, secret=secret)
        print(f"serving   `{args.served_model_name or model}` disaggregated {x}P{y}D at {url_of(sock)}/v1 "
              f"(workers: {', '.join(w.url for w in workers)}; KV over {args.kv_connector})", flush=True)
        limits = front_limits(args)
        front_server(build_front(front, limits), limits).run(sockets=[sock])
        return 0
    finally:
        _stop(procs)
        sock.close()
