"""Fake replicas for the router tests: a raw HTTP server whose answers (and failures) the test
chooses exactly, so "the replica died before answering" or "after the first chunk" is certain."""
from __future__ import annotations

import json
import socket
import threading

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'


class FakeReplica:
    """mode: "ok" answers every POST with a 2-chunk stream; "drop" closes the connection on a POST
    without answering; "cut" sends the stream's headers and one chunk, then closes."""

    def __init__(self, model: str = "tiny", mode: str = "ok"):
        self.model = model
        self.mode = mode
        self.posts = 0
        self.auth: list[str | None] = []  # each POST's Authorization header
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def info(self) -> dict:
        return {"model": self.model, "model_path": "/nonexistent", "block_size": 16, "kv_events_endpoint": None}

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                part = conn.recv(65536)
                if not part:
                    return
                data += part
            head, _, rest = data.partition(b"\r\n\r\n")
            line = head.split(b"\r\n")[0].decode()
            method, path = line.split()[:2]
            length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                           if h.lower().startswith(b"content-length")), 0)
            while len(rest) < length:
                rest += conn.recv(65536)
            if method == "GET":
                body = json.dumps(self.info() if path == "/info" else {"status": "ok"}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(body), body))
                return
            self.posts += 1
            self.auth.append(next((h.split(b":", 1)[1].strip().decode() for h in head.split(b"\r\n")
                                   if h.lower().startswith(b"authorization:")), None))
            if self.mode == "drop":
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
                         b"connection: close\r\n\r\n" + _chunk(CHUNK))
            if self.mode == "cut":
                return
            conn.sendall(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    def close(self) -> None:
        try:  # wakes the accept() in _serve, which a plain close() does not
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(10)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)
