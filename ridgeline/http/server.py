"""Sockets bound up front (port 0 picks a free one) and uvicorn servers on them, for every front.

SignalServer: a uvicorn server whose SIGINT/SIGTERM in the main thread go to a method the front
defines (the OpenAI server drains: serve/server.py; the router stops). UvicornThread: one on a
background thread (tests, notebooks, benchmarks).
"""
from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time

import uvicorn

from ridgeline.utils.net import bind_tcp


def bind(host: str, port: int) -> socket.socket:
    return bind_tcp(host, port)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class SignalServer(uvicorn.Server):
    """A uvicorn server whose SIGINT/SIGTERM (in the main thread) go to _on_signal, instead of uvicorn
    capturing them and re-raising them once it has stopped."""

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
        raise NotImplementedError


class UvicornThread:
    """A uvicorn server on a background thread, on a socket already bound (tests, benchmarks)."""

    def __init__(self, server: uvicorn.Server, sock, what: str):
        self.server, self.sock, self.what = server, sock, what
        self.url = url_of(sock)
        self.thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"ridgeline-{what}",
                                       daemon=True)

    def start(self, timeout: float = 30.0):
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the {self.what} at {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
