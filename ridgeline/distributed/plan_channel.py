"""Rank 0's step plans to the other ranks: one authenticated TCP connection per follower.

On one machine each follower gets its end of a socket pair when rank 0 starts it (no port at all);
across machines rank 0 listens on the master address (never the wildcard) only until every
follower has connected, then closes the listener, so a running group has no open port of its own.
Either way both ends prove they hold the launch's secret (utils/internal_auth.py: a mutual
challenge-response, the follower's rank in its hello). A connection that fails the handshake, or
claims a rank already taken or out of range, is logged and closed; the rest keep waiting until
dist_timeout. Each call is one frame (wire.py's codec, tagged and sequenced for
that connection), sent to every follower in order; a follower checks the frame's tag, decodes it to
registered types only and checks every index in it (plan_check.py) before the runner sees it."""
from __future__ import annotations

import logging
import socket
import time

from ridgeline.distributed import wire, wire_types  # noqa: F401  (registers what a plan holds)
from ridgeline.distributed.plan_check import Limits, check_call
from ridgeline.errors import InvalidRequestError
from ridgeline.utils import internal_auth
from ridgeline.utils.net import bind_tcp

log = logging.getLogger(__name__)
LABEL = "ridgeline-plan/1"
MAX_FRAME = 1 << 30  # a plan with full-vocabulary draft distributions for a large batch stays under this
HANDSHAKE_S = 10.0


def listen(addr: str) -> socket.socket:
    """A listening socket on addr (a free port), for the followers to connect to."""
    try:
        return bind_tcp(addr, 0, 64)
    except OSError as e:
        raise InvalidRequestError(f"rank 0 cannot listen on {addr} for the other ranks: {e.strerror}",
                                  "master_addr") from None


class PlanLeader:
    """Rank 0's end: one authenticated session per follower, in rank order."""

    def __init__(self, sessions: dict[int, internal_auth.Session]):
        self.sessions = sessions
        self.order = [sessions[r] for r in sorted(sessions)]

    @classmethod
    def over_pairs(cls, socks: dict[int, socket.socket], secret: bytes, timeout: float) -> "PlanLeader":
        """One machine: each follower's end of a socket pair was handed to its process at start."""
        sessions = {}
        try:
            for rank, sock in sorted(socks.items()):
                session = internal_auth.accept(sock, secret, LABEL, timeout)
                if session.hello != str(rank).encode():
                    raise internal_auth.AuthError(f"the process on rank {rank}'s channel says it is {session.hello!r}")
                sessions[rank] = session
        except (internal_auth.AuthError, OSError) as e:
            for sock in socks.values():
                sock.close()
            raise InvalidRequestError(f"a rank failed the plan channel's handshake: {e}", "parallel") from None
        return cls(sessions)

    @classmethod
    def over_listener(cls, listener: socket.socket, secret: bytes, size: int, timeout: float) -> "PlanLeader":
        """Across machines: accept size - 1 authenticated followers within timeout, then stop listening."""
        sessions: dict[int, internal_auth.Session] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(sessions) < size - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, size)) - set(sessions))
                    raise InvalidRequestError(f"ranks {missing} did not connect to rank 0's plan channel within "
                                              f"{timeout:g} s (dist_timeout)", "parallel")
                listener.settimeout(left)
                try:
                    conn, peer = listener.accept()
                except TimeoutError:
                    continue
                _admit(sessions, conn, peer, secret, size)
        except BaseException:
            for s in sessions.values():
                s.sock.close()
            raise
        finally:
            listener.close()
        return cls(sessions)

    def send(self, method: str, args: tuple) -> None:
        frame = wire.encode((method, args))
        for s in self.order:
            s.send(frame)

    def close(self) -> None:
        for s in self.order:
            s.sock.close()


def _admit(sessions: dict, conn: socket.socket, peer, secret: bytes, size: int) -> None:
    try:
        session = internal_auth.accept(conn, secret, LABEL, HANDSHAKE_S)
        rank = int(session.hello.decode("ascii"))
        if not 0 < rank < size or rank in sessions:
            raise internal_auth.AuthError(f"a follower claiming rank {rank}, taken or out of range")
    except (internal_auth.AuthError, OSError, ValueError) as e:
        log.warning("plan channel: refused a connection from %s: %s", _peer(peer), e)
        conn.close()
        return
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sessions[rank] = session


def dial(addr: str, port: int, rank: int, timeout: float) -> socket.socket:
    """A follower's connection to rank 0's listener, retried while rank 0 starts listening."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=HANDSHAKE_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            if time.monotonic() > deadline:
                raise InvalidRequestError(f"rank {rank} cannot reach rank 0's plan channel at {addr}:{port} "
                                          f"within {timeout:g} s ({e})", "parallel") from None
            time.sleep(0.05)


class PlanFollower:
    """A follower's end: proves its rank on `sock`, then reads calls."""

    def __init__(self, sock: socket.socket, secret: bytes, rank: int, timeout: float = HANDSHAKE_S):
        try:
            self.session = internal_auth.connect(sock, secret, LABEL, timeout, str(rank).encode())
        except (internal_auth.AuthError, OSError) as e:
            sock.close()
            raise InvalidRequestError(f"rank {rank}: rank 0's plan channel failed authentication ({e}); every rank "
                                      "needs the same internal secret (--internal-secret-file)", "parallel") from None
        self.rank = rank

    def recv(self, limits: Limits) -> tuple[str, tuple]:
        """The next call, authenticated, decoded and checked (blocks until rank 0 sends one; an idle
        server is not a failure, a closed connection is: ConnectionError)."""
        method, args = _call(wire.decode(self.session.recv(MAX_FRAME)))
        check_call(method, args, limits)
        return method, args

    def close(self) -> None:
        self.session.sock.close()


def _call(value) -> tuple[str, tuple]:
    if not (isinstance(value, tuple) and len(value) == 2):
        raise wire.WireError("a plan frame that is not (method, arguments)")
    return value


def _peer(peer) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
