"""A TCP listener for an internal channel: it binds the address it is given (loopback by default,
never the wildcard unless asked), serves each connection on its own thread, at most
`max_connections` at once (one over the limit is closed at once), and hands a connection to its
handler only after the peer passed internal_auth's handshake within `handshake_timeout` seconds.
Every refusal (limit, failed handshake, a frame the handler refuses) is one WARNING line naming
the peer and the reason."""
from __future__ import annotations

import socket
import threading
from typing import Callable

from ridgeline.disagg.wire import Refused, Rejections, log, peer_name
from ridgeline.utils import internal_auth

DEFAULT_MAX_CONNECTIONS = 256  # connections served at once, each on its own thread
DEFAULT_HANDSHAKE_TIMEOUT = 5.0  # seconds a new connection has to authenticate


class AuthListener:
    def __init__(self, channel: str, label: str, secret: bytes, host: str, port: int,
                 handler: Callable[[internal_auth.Session, tuple], None],
                 max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT):
        if not secret:
            raise ValueError("an internal listener needs the deployment's secret")
        self.channel, self.label, self.secret, self.handler = channel, label, secret, handler
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.rejections = Rejections(channel)
        self.sock = socket.create_server((host, port), backlog=128)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def start(self) -> AuthListener:
        if self._thread is None:
            self._thread = threading.Thread(target=self._accept_loop, name=self.channel, daemon=True)
            self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                if self._closed:
                    return
                continue
            if not self._slots.acquire(blocking=False):
                self.rejections(peer, f"{self.max_connections} connections already open (the limit)")
                conn.close()
                continue
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer), name=f"{self.channel}-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        try:
            try:
                session = internal_auth.accept(conn, self.secret, self.label, self.handshake_timeout)
            except (internal_auth.AuthError, OSError) as e:
                self.rejections(peer, f"handshake failed: {_why(e)}")
                return
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.handler(session, peer)
            except (Refused, internal_auth.AuthError) as e:
                self.rejections(peer, e.message)
            except OSError as e:
                if not self._closed:
                    self.rejections(peer, _why(e))
            except Exception:  # noqa: BLE001 (a bug must cost this connection only, and be seen)
                log.exception("%s: internal error serving %s; connection closed", self.channel, peer_name(peer))
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
            self._slots.release()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop
        except OSError:
            pass
        self.sock.close()
        with self._lock:
            conns = list(self._open)
        for c in conns:  # wakes the threads blocked reading them
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5)


def _why(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, internal_auth.AuthError):
        return e.message
    return str(e) or type(e).__name__
