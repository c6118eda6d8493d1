"""The internal channels' handshake and frames (utils/internal_auth.py): only a peer holding the
secret gets through, and a frame is accepted once, in order, on the connection and in the direction
it was made for."""
import os
import socket
import stat
import threading

import pytest

from ridgeline.errors import InvalidRequestError
from ridgeline.utils import internal_auth as ia

SECRET = b"s" * 32


def _pair(server_secret=SECRET, client_secret=SECRET, label="test", client_label=None, hello=b"rank 1"):
    a, b = socket.socketpair()
    out = {}

    def serve():
        try:
            out["server"] = ia.accept(a, server_secret, label, 5)
        except (ia.AuthError, OSError) as e:
            out["server_error"] = e
            a.close()

    t = threading.Thread(target=serve)
    t.start()
    try:
        client = ia.connect(b, client_secret, client_label or label, 5, hello)
    except (ia.AuthError, OSError) as e:
        client = e
    t.join()
    return out, client


def test_both_sides_with_the_secret_share_a_session():
    out, client = _pair()
    server = out["server"]
    assert server.hello == b"rank 1" and server.key == client.key
    client.send(b"plan 0")
    client.send(b"plan 1")
    assert server.recv(100) == b"plan 0" and server.recv(100) == b"plan 1"
    server.send(b"answer")
    assert client.recv(100) == b"answer"


@pytest.mark.parametrize("who", ["client", "server"])
def test_a_peer_without_the_secret_is_refused(who):
    wrong = b"w" * 32
    out, client = _pair(**({"client_secret": wrong} if who == "client" else {"server_secret": wrong}))
    # the server checks first: either way it refuses, and the client never gets a session
    assert isinstance(out["server_error"], ia.AuthError)
    assert isinstance(client, (ia.AuthError, OSError))


def test_another_channels_server_is_refused():
    out, client = _pair(client_label="other")
    assert isinstance(client, ia.AuthError)


def _raw_frame(session, body):
    """What session.send would write, captured."""
    a, b = socket.socketpair()
    keep = session.sock
    session.sock = a
    session.send(body)
    session.sock = keep
    a.close()
    data = b.recv(1 << 16)
    b.close()
    return data


def test_replayed_reflected_tampered_and_oversized_frames_are_refused():
    out, client = _pair()
    server = out["server"]
    first = _raw_frame(client, b"plan 0")  # seq 0, as the client made it
    client.sock.sendall(first)
    assert server.recv(100) == b"plan 0"
    client.sock.sendall(first)  # the same frame again: seq 0 is spent
    with pytest.raises(ia.AuthError, match="out of sequence"):
        server.recv(100)

    out, client = _pair()
    server = out["server"]
    reflected = _raw_frame(server, b"x")  # a server frame played back to the server
    client.sock.sendall(reflected)
    with pytest.raises(ia.AuthError, match="tag"):
        server.recv(100)

    out, client = _pair()
    server = out["server"]
    frame = bytearray(_raw_frame(client, b"plan 0"))
    frame[-1] ^= 1
    client.sock.sendall(bytes(frame))
    with pytest.raises(ia.AuthError, match="tag"):
        server.recv(100)

    out, client = _pair()
    server = out["server"]
    client.sock.sendall(_raw_frame(client, b"y" * 1000))
    with pytest.raises(ia.AuthError, match="over this channel's limit"):
        server.recv(999)


def test_a_frame_from_another_connection_is_refused():
    out1, c1 = _pair()
    out2, c2 = _pair()
    c2.sock.sendall(_raw_frame(c1, b"plan 0"))
    with pytest.raises(ia.AuthError, match="tag"):
        out2["server"].recv(100)


def test_secret_file_rules(tmp_path, monkeypatch):
    p = tmp_path / "secret"
    p.write_bytes(b"0123456789abcdef0123\n")
    p.chmod(0o600)
    assert ia.read_secret_file(p) == b"0123456789abcdef0123"
    p.chmod(0o644)
    with pytest.raises(InvalidRequestError, match="chmod 600"):
        ia.read_secret_file(p)
    p.chmod(0o600)
    p.write_bytes(b"short")
    with pytest.raises(InvalidRequestError, match="at least 16"):
        ia.read_secret_file(p)
    with pytest.raises(InvalidRequestError, match="cannot read"):
        ia.read_secret_file(tmp_path / "missing")
    env = ia.env_with_secret(SECRET, {})
    monkeypatch.setenv(ia.SECRET_ENV, env[ia.SECRET_ENV])
    assert ia.take_secret_from_env() == SECRET and ia.SECRET_ENV not in os.environ
    assert ia.take_secret_from_env() is None
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
