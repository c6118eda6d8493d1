"""Launchers' child servers (utils/child_servers.py): ready when the route answers, a child that exits
while starting fails the start at once and is named, and stop_all ends even a child ignoring SIGTERM."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from ridgeline.utils.child_servers import stop_all, wait_ready

SERVE = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "key": self.headers.get("Authorization")}).encode()
        self.send_response(200); self.send_header("content-type", "application/json"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(code: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)])


def test_ready_children_answer_with_their_bodies_and_headers():
    ports = [_port(), _port()]
    procs = [_child(SERVE, p) for p in ports]
    try:
        bodies = wait_ready([(p, f"http://127.0.0.1:{port}") for p, port in zip(procs, ports)], "/info",
                            [{"Authorization": "a"}, {"Authorization": "b"}], 30, ["one", "two"], RuntimeError)
        assert bodies == [{"path": "/info", "key": "a"}, {"path": "/info", "key": "b"}]
    finally:
        stop_all(procs)
    assert all(p.poll() is not None for p in procs)


def test_a_child_that_exits_while_starting_is_named_at_once():
    gone = _child("import sys; sys.exit(7)")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="the worker exited with code 7 while starting"):
        wait_ready([(gone, f"http://127.0.0.1:{_port()}")], "/health", {}, 60, ["the worker"], RuntimeError)
    assert time.monotonic() - t0 < 30  # not the whole timeout


def test_the_deadline_names_who_is_not_ready_and_stop_all_kills_a_stubborn_child():
    stubborn = _child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)")
    try:
        with pytest.raises(RuntimeError, match=r"replica 3 not ready after 0.5s \(hint\)"):
            wait_ready([(stubborn, f"http://127.0.0.1:{_port()}")], "/health", {}, 0.5, ["replica 3"], RuntimeError,
                       " (hint)")
    finally:
        stop_all([stubborn], grace=0.5)
    assert stubborn.poll() is not None
