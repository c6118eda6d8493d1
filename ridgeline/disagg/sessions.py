"""Authenticated connections to internal endpoints, kept open between calls as HTTP keep-alive keeps
its connections: the handshake (a round trip and a half, three HMACs) is paid once per connection,
not once per request on the time-to-first-token path.

A call takes an idle connection to its address (or opens one), makes one whole exchange on it and
gives it back; any failure closes it. One idle for more than `max_idle` seconds (less than the
server's idle limit, connector.IDLE_TIMEOUT) or already closed by the server is not reused. A call
whose reused connection fails before any answer (the server closed it meanwhile) is made once more
on a new connection: nothing of it reached the server."""
from __future__ import annotations

import socket
import threading
import time

from ridgeline.disagg.wire import MAX_HEADER, recv_json, send_json
from ridgeline.utils import internal_auth

MAX_IDLE_S = 30.0
MAX_IDLE_PER_ADDRESS = 16


class SessionPool:
    def __init__(self, secret: bytes, label: str, hello: bytes, timeout: float, max_idle: float = MAX_IDLE_S,
                 max_idle_per_address: int = MAX_IDLE_PER_ADDRESS):
        self.secret, self.label, self.hello, self.timeout = secret, label, hello, timeout
        self.max_idle, self.max_idle_per_address = max_idle, max_idle_per_address
        self._idle: dict[tuple[str, int], list[tuple[internal_auth.Session, float]]] = {}
        self._lock = threading.Lock()
        self.opened = 0  # connections opened (handshakes made)

    def take(self, host: str, port: int) -> tuple[internal_auth.Session, bool]:
        """(a session to host:port, whether it was reused); OSError or AuthError if none opens."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get((host, port))
                item = idle.pop() if idle else None
            if item is None:
                break
            session, since = item
            if now - since < self.max_idle and _open(session.sock):
                session.sock.settimeout(self.timeout)
                return session, True
            session.sock.close()
        sock = socket.create_connection((host, port), timeout=self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = internal_auth.connect(sock, self.secret, self.label, self.timeout, self.hello)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(self.timeout)
        self.opened += 1
        return session, False

    def give(self, host: str, port: int, session: internal_auth.Session) -> None:
        """Back to the pool after a whole exchange."""
        with self._lock:
            idle = self._idle.setdefault((host, port), [])
            if len(idle) < self.max_idle_per_address:
                idle.append((session, time.monotonic()))
                return
        session.sock.close()

    def call(self, host: str, port: int, request: dict, answer_timeout: float | None = None,
             cap: int = MAX_HEADER) -> dict:
        """One request and its answer (waited for up to answer_timeout seconds, `timeout` by default);
        OSError, AuthError or Refused on failure."""
        for attempt in (0, 1):
            session, reused = self.take(host, port)
            answered = False
            try:
                send_json(session, request)
                session.sock.settimeout(answer_timeout or self.timeout)
                if reused and not session.sock.recv(1, socket.MSG_PEEK):  # waits for the answer's first byte
                    raise ConnectionError("the server had closed the connection")
                answered = True  # past here a failure is never retried: the server has the request
                answer = recv_json(session, cap)
            except (OSError, internal_auth.AuthError):
                session.sock.close()
                if reused and not answered and attempt == 0:
                    continue
                raise
            except BaseException:
                session.sock.close()
                raise
            session.sock.settimeout(self.timeout)
            self.give(host, port, session)
            return answer
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for sessions in idle.values():
            for session, _ in sessions:
                session.sock.close()


def _open(sock: socket.socket) -> bool:
    """Still connected, with nothing unread (an idle connection the server has not closed)."""
    try:
        sock.setblocking(False)
        try:
            sock.recv(1, socket.MSG_PEEK)  # b"": closed; a byte: something unread. Neither is reusable
            return False
        finally:
            sock.setblocking(True)
    except BlockingIOError:  # nothing to read, and still connected
        return True
    except OSError:
        return False
