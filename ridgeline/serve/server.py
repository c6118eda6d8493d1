"""Run the app under uvicorn on a socket bound up front (port 0 picks a free one).

serve_forever: the CLI's main-thread server; SIGINT/SIGTERM stop accepting, let in-flight requests
finish for up to drain_timeout seconds, abort the rest, and return (exit 0). A second signal quits
without waiting. ServerThread: the same server on a background thread (tests, notebooks, benchmarks).
"""
from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
import time

import uvicorn
from fastapi import FastAPI


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _config(app: FastAPI, drain_timeout: float, access_log: bool) -> uvicorn.Config:
    return uvicorn.Config(app, lifespan="on", timeout_graceful_shutdown=drain_timeout, access_log=access_log,
                          log_level="info", timeout_keep_alive=5)


class _DrainingServer(uvicorn.Server):
    """uvicorn re-raises the signal after a graceful shutdown (exit status 128+n); here a signal
    means: drain, then return normally."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, sig: int, frame) -> None:
        if self.should_exit:
            print("second signal: quitting without waiting", file=sys.stderr, flush=True)
            self.force_exit = True
        else:
            print(f"{signal.Signals(sig).name}: draining in-flight requests for up to "
                  f"{self.config.timeout_graceful_shutdown:g}s", file=sys.stderr, flush=True)
            self.should_exit = True


def serve_forever(app: FastAPI, sock: socket.socket, drain_timeout: float, access_log: bool = False) -> None:
    _DrainingServer(_config(app, drain_timeout, access_log)).run(sockets=[sock])


class ServerThread:
    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, drain_timeout: float = 5.0):
        self.sock = bind(host, port)
        self.url = url_of(self.sock)
        self.server = _DrainingServer(_config(app, drain_timeout, access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="ridgeline-http", daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
