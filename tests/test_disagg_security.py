"""The internal channels of disaggregation admit only their deployment: a decode worker's KV connector
and a prefill worker's internal endpoint refuse (and log, naming the peer) a peer without the
secret, a replayed frame, an oversized or lying header (before allocating anything), a transfer id
they did not issue, a truncated or late payload (dropping that transfer alone), a shared-memory
segment not named after its transfer, connections over their limit, and pickles; the prefill
worker's public server has no prefill route, and it ships KV only to a peer that proves it holds
the secret. A worker with a role and no secret does not start."""
from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import struct
import threading
import tracemalloc
from multiprocessing import shared_memory

import httpx
import numpy as np
import pytest

from disagg_helpers import SECRET, worker_server
from ridgeline.disagg.adopt import attach
from ridgeline.cli import main
from ridgeline.disagg.connector import ReceiveLimits, TransferError, request_transfer
from ridgeline.disagg.inbox import Inbox
from ridgeline.disagg.payload import Header, Layout
from ridgeline.disagg.sessions import SessionPool
from ridgeline.disagg.transports import create_connector
from ridgeline.disagg.wire import (LABEL_KV, LABEL_PREFILL, Refused, call, new_transfer_id, parse_address,
                                   recv_json, send_json)
from ridgeline.disagg.worker import deployment_secret
from ridgeline.utils import internal_auth
from server_helpers import wait_until

SAFETY_S = 60.0
LAYOUT = Layout("layers=1;test", 16, 64, 1000)  # 64 bytes a block of 16 positions; prompts up to 1000 tokens
FRAME = struct.Struct("<4sQQ32s")  # an internal frame's header: magic, seq, body length, tag
BIG = 8 << 20  # no refusal below may allocate anywhere near this


@pytest.fixture(autouse=True)
def _log(caplog):
    caplog.set_level(logging.WARNING, logger="ridgeline.disagg")


@pytest.fixture(params=["tcp", "shm"])
def receiver(request):
    c = create_connector(request.param, timeout=SAFETY_S, secret=SECRET)
    c.listen(LAYOUT)
    yield c
    c.close()


def _refused(caplog, *words: str) -> str:
    """The refusal line that names all of `words` (waits for it: the receiving thread logs it)."""
    def line():
        return next((r.getMessage() for r in caplog.records
                     if "refused" in r.getMessage() and all(w in r.getMessage() for w in words)), None)
    wait_until(lambda: line() is not None, f"a refusal naming {words}")
    assert "127.0.0.1:" in line()  # names the peer
    return line()


def _session(address: str, secret: bytes = SECRET, label: str = LABEL_KV) -> internal_auth.Session:
    sock = socket.create_connection(parse_address(address, address.partition("://")[0]), timeout=SAFETY_S)
    session = internal_auth.connect(sock, secret, label, SAFETY_S, b"test")
    sock.settimeout(SAFETY_S)
    return session


def _closed(session: internal_auth.Session | socket.socket) -> bool:
    """The peer closed the connection (after whatever it answered): EOF or a reset, never a timeout."""
    sock = session.sock if isinstance(session, internal_auth.Session) else session
    try:
        while sock.recv(4096):
            pass
    except ConnectionError:
        pass
    return True


def _meta(tid: str, num_tokens: int = 20, **kw) -> dict:
    blocks = -(-num_tokens // LAYOUT.block_size)
    return {"op": "kv", "transfer_id": tid, "spec_key": LAYOUT.spec_key, "num_tokens": num_tokens, "first_token": 1,
            "num_blocks": blocks, "nbytes": blocks * LAYOUT.bytes_per_block, "rng_bytes": -1, **kw}


def _with_transport(receiver, meta: dict) -> dict:
    return {**meta, "shm": f"rlkv-{meta['transfer_id']}"} if receiver.name == "shm" else meta


def _raw(session: internal_auth.Session, body: bytes, **kw) -> bytes:
    """The bytes session.send(body, **kw) writes (and the session counts it sent)."""
    a, b = socket.socketpair()
    keep, session.sock = session.sock, a
    try:
        session.send(body, **kw)
    finally:
        session.sock = keep
        a.close()
    data = b.recv(1 << 16)
    b.close()
    return data


def _peak(fn) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_peer_without_the_secret_is_refused_and_logged(receiver, caplog):
    with pytest.raises((internal_auth.AuthError, OSError)):
        _session(receiver.address, secret=b"w" * 32)
    _refused(caplog, "handshake failed", "internal secret")
    with pytest.raises(TransferError, match="no transfer id"):
        request_transfer(SessionPool(b"w" * 32, LABEL_KV, b"test", SAFETY_S), receiver.address)
    assert receiver.inbox.outstanding == 0


def test_a_replayed_frame_is_refused(receiver, caplog):
    s = _session(receiver.address)
    frame = _raw(s, json.dumps({"op": "expect"}).encode())
    s.sock.sendall(frame)
    assert recv_json(s)["ok"] is True
    s.sock.sendall(frame)  # the same bytes again: its sequence number is spent
    assert _closed(s)
    _refused(caplog, "out of sequence")
    assert receiver.inbox.outstanding == 1


def test_an_oversized_header_is_refused_before_it_is_read(receiver, caplog):
    s = _session(receiver.address)

    def send():  # only the frame's 56-byte header, announcing 1 GiB: the refusal cannot wait for the body
        s.sock.sendall(FRAME.pack(internal_auth.MAGIC, 0, 1 << 30, bytes(32)))
        assert _closed(s)
        _refused(caplog, "over this channel's limit of 65536")
    assert _peak(send) < BIG


@pytest.mark.parametrize("lie, why", [({"nbytes": 1 << 40}, "nbytes"), ({"num_blocks": 1 << 30}, "num_blocks"),
                                      ({"num_tokens": 5000, "num_blocks": 313, "nbytes": 313 * 64}, "num_tokens"),
                                      ({"spec_key": "other"}, "KV layout"), ({"rng_bytes": 1 << 30}, "rng_bytes"),
                                      ({"transfer_id": "../../etc"}, "32 lowercase hex")])
def test_a_lying_header_is_refused_without_allocating(receiver, caplog, lie, why):
    tid = receiver.inbox.expect()
    s = _session(receiver.address)

    def send():
        send_json(s, {**_with_transport(receiver, _meta(tid)), **lie})
        answer = recv_json(s)
        assert answer["ok"] is False and why in answer["reason"]
        assert _closed(s)
    assert _peak(send) < BIG
    _refused(caplog, why)
    assert receiver.inbox.bytes == 0


def test_a_transfer_id_nobody_issued_is_refused(receiver, caplog):
    s = _session(receiver.address)
    tid = new_transfer_id()
    send_json(s, _with_transport(receiver, _meta(tid)))
    answer = recv_json(s)
    assert answer["ok"] is False and "not issued" in answer["reason"]
    _refused(caplog, tid, "not issued")
    # a sender that goes through the connector hears why
    out = receiver.prepare(Header(new_transfer_id(), LAYOUT.spec_key, [1] * 20, 1, 2, 128), lambda o: _fill(o, 128))
    with pytest.raises(TransferError, match="not issued"):
        create_connector(receiver.name, timeout=SAFETY_S, secret=SECRET).deliver(out, receiver.address)


def _fill(out, n: int):
    out = np.empty(n, np.uint8) if out is None else out
    out[:] = np.arange(n) % 251
    return out


def _deliver(receiver, tid: str, num_tokens: int = 20):
    sender = create_connector(receiver.name, timeout=SAFETY_S, secret=SECRET)
    blocks = -(-num_tokens // 16)
    out = sender.prepare(Header(tid, LAYOUT.spec_key, list(range(num_tokens)), 7, blocks, blocks * 64),
                         lambda o: _fill(o, blocks * 64))
    return sender.deliver(out, receiver.address)


def test_a_truncated_payload_is_dropped_and_only_its_own(caplog):
    receiver = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    receiver.listen(LAYOUT)
    try:
        bad, good = receiver.inbox.expect(), receiver.inbox.expect()
        s = _session(receiver.address)
        send_json(s, _meta(bad))
        assert recv_json(s)["ok"] is True
        tail = Header(bad, LAYOUT.spec_key, list(range(20)), 1, 2, 128).tail()
        frame = _raw(s, tail, macced=len(tail), extra=bytes(128))
        s.sock.sendall(frame[:-64])  # the frame as announced, but only half of its KV bytes
        s.sock.shutdown(socket.SHUT_WR)
        _refused(caplog, "closed mid-transfer")
        assert receiver.inbox.take(bad, SAFETY_S) is None  # dropped at once: its request computes its prompt
        _deliver(receiver, good)  # the other transfer is whole
        payload = receiver.inbox.take(good, SAFETY_S)
        assert payload.authenticated and payload.data.tolist() == (np.arange(128) % 251).tolist()
        assert receiver.inbox.bytes == 128
        payload.release()
        assert receiver.inbox.bytes == 0
    finally:
        receiver.close()


def test_a_body_bound_to_another_transfer_is_refused(caplog):
    receiver = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    receiver.listen(LAYOUT)
    try:
        tid = receiver.inbox.expect()
        s = _session(receiver.address)
        send_json(s, _meta(tid))
        assert recv_json(s)["ok"] is True
        tail = Header(new_transfer_id(), LAYOUT.spec_key, list(range(20)), 1, 2, 128).tail()
        s.send(tail, macced=len(tail), extra=bytes(128))
        assert _closed(s)
        _refused(caplog, "another transfer")
        assert receiver.inbox.take(tid, SAFETY_S) is None and receiver.inbox.bytes == 0
    finally:
        receiver.close()


def test_a_transfer_past_its_deadline_is_dropped(caplog):
    receiver = create_connector("tcp", timeout=0.5, secret=SECRET)  # the deadline of one transfer
    receiver.listen(LAYOUT)
    try:
        tid = receiver.inbox.expect()
        s = _session(receiver.address)
        send_json(s, _meta(tid))
        assert recv_json(s)["ok"] is True  # ... and then nothing comes
        assert _closed(s)
        _refused(caplog, tid, "did not arrive whole")
        assert receiver.inbox.take(tid, SAFETY_S) is None and receiver.inbox.bytes == 0
    finally:
        receiver.close()


def test_over_the_inbox_budget_is_refused(caplog):
    receiver = create_connector("tcp", timeout=SAFETY_S, secret=SECRET, limits=ReceiveLimits(inbox_bytes=100))
    receiver.listen(LAYOUT)
    try:
        tid = receiver.inbox.expect()
        with pytest.raises(TransferError, match="over its budget"):
            _deliver(receiver, tid)  # 128 bytes
        _refused(caplog, "over its budget")
        assert receiver.inbox.take(tid, 0) is None and receiver.inbox.bytes == 0
    finally:
        receiver.close()


def test_the_inbox_bounds_ids_bytes_and_time():
    inbox = Inbox(ttl=SAFETY_S, budget=100, max_expected=2)
    a, b = inbox.expect(), inbox.expect()
    with pytest.raises(Refused, match="already outstanding"):
        inbox.expect()
    give_back = inbox.reserve(a, 100)
    with pytest.raises(Refused, match="already received"):
        inbox.reserve(a, 1)
    with pytest.raises(Refused, match="budget"):
        inbox.reserve(b, 1)
    give_back()
    give_back()  # idempotent
    assert inbox.bytes == 0
    inbox.abandon(a)
    with pytest.raises(Refused, match="not issued"):
        inbox.reserve(a, 1)
    assert inbox.take(new_transfer_id(), SAFETY_S) is None  # not outstanding: at once, not after the wait
    stale = Inbox(ttl=0.0)
    old = stale.expect()
    stale.expect()  # the first one's time is up
    with pytest.raises(Refused, match="not issued"):
        stale.reserve(old, 1)


def test_a_shm_segment_is_mapped_only_under_its_transfers_name(caplog):
    receiver = create_connector("shm", timeout=SAFETY_S, secret=SECRET)
    receiver.listen(LAYOUT)
    other = shared_memory.SharedMemory(name=f"rlkv-{new_transfer_id()}", create=True, size=128)
    try:
        for name in (other.name, "../../dev/zero", "rlkv-" + "0" * 32):
            tid = receiver.inbox.expect()
            s = _session(receiver.address)
            send_json(s, {**_meta(tid), "shm": name})
            answer = recv_json(s)
            assert answer["ok"] is False and "is not this transfer's" in answer["reason"]
        _refused(caplog, "is not this transfer's")
        assert shared_memory.SharedMemory(name=other.name).size >= 128  # neither mapped nor unlinked there
        tid = receiver.inbox.expect()
        _deliver(receiver, tid)  # the segment named after the transfer: taken, then unlinked with the payload
        payload = receiver.inbox.take(tid, SAFETY_S)
        assert payload.data.tolist() == (np.arange(128) % 251).tolist()
        payload.release()
        assert not os.path.exists(f"/dev/shm/rlkv-{tid}")
    finally:
        other.close()
        other.unlink()
        receiver.close()


def test_connections_over_the_limit_are_closed_at_once(caplog):
    receiver = create_connector("tcp", timeout=SAFETY_S, secret=SECRET, limits=ReceiveLimits(max_connections=2))
    receiver.listen(LAYOUT)
    host, port = parse_address(receiver.address, "tcp")
    held = [socket.create_connection((host, port), timeout=SAFETY_S) for _ in range(2)]
    try:
        for sock in held:  # each is being served: the handshake's first bytes came
            assert sock.recv(4) == internal_auth.MAGIC
        with socket.create_connection((host, port), timeout=SAFETY_S) as third:
            assert third.recv(4) == b""  # closed before any handshake
        _refused(caplog, "2 connections already open")
    finally:
        for sock in held:
            sock.close()
        receiver.close()


class Canary:
    """Unpickling this creates a file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture(scope="module")
def prefill_worker(tiny_llama):
    server, worker = worker_server(tiny_llama, "prefill", "auto", timeout=5.0)
    yield server, worker
    server.stop()
    worker.close()


def test_pickles_are_never_unpickled(receiver, prefill_worker, tmp_path, caplog):
    canary = tmp_path / "unpickled"
    blob = pickle.dumps(Canary(str(canary)))
    for address, label in ((receiver.address, LABEL_KV), (prefill_worker[1].endpoint.address, LABEL_PREFILL)):
        with socket.create_connection(parse_address(address, address.partition("://")[0]), timeout=SAFETY_S) as sock:
            sock.recv(64)  # the server's challenge
            sock.sendall(blob + bytes(256))  # a pickle where the handshake's answer goes
            sock.settimeout(SAFETY_S)
            assert _closed(sock)
        s = _session(address, label=label)
        s.send(blob)  # and one inside an authenticated frame
        assert _closed(s)
    assert not canary.exists()
    assert len([r for r in caplog.records if "handshake failed" in r.getMessage()]) >= 2
    _refused(caplog, "not JSON")


def test_the_public_server_has_no_prefill_route(prefill_worker):
    server, worker = prefill_worker
    body = {"route": "/v1/completions", "body": {"prompt": "hi"}, "transfer_id": new_transfer_id(),
            "target": "tcp://127.0.0.1:9"}
    assert httpx.post(server.url + "/disagg/prefill", json=body).status_code == 404
    assert httpx.get(server.url + "/disagg/info").json()["internal"] == worker.endpoint.address


def test_a_prefill_ships_kv_only_to_a_peer_holding_the_secret(prefill_worker, caplog):
    """An authenticated prefill request naming a target that is not a decode worker of this deployment:
    the prefill worker opens the connection, but the target never gets a byte of KV (the client speaks
    only after the server proved it holds the secret)."""
    got: list[bytes] = []
    plain = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = plain.accept()
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
            conn.settimeout(SAFETY_S)
            try:
                while data := conn.recv(4096):
                    got.append(data)
            except ConnectionError:  # the prefill worker hung up on a server that is not one of its own
                pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    host, port = parse_address(prefill_worker[1].endpoint.address, "tcp")
    request = {"op": "prefill", "route": "/v1/completions", "transfer_id": new_transfer_id(),
               "target": f"tcp://127.0.0.1:{plain.getsockname()[1]}",
               "body": {"model": prefill_worker[0].app.state.ridgeline.settings.served_model_name, "prompt": "hello",
                        "max_tokens": 4}}
    answer = call(host, port, SECRET, LABEL_PREFILL, request, SAFETY_S, SAFETY_S)
    assert answer["status"] == "failed" and "internal protocol" in answer["error"]
    t.join(SAFETY_S)
    plain.close()
    assert got == []
    # a malformed one is refused, and the connection stays usable
    bad = {**request, "transfer_id": "x", "target": "http://elsewhere"}
    assert call(host, port, SECRET, LABEL_PREFILL, bad, SAFETY_S)["status"] == "failed"
    _refused(caplog, "32 lowercase hex")


def test_a_worker_with_a_role_needs_the_secret(tiny_llama, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(internal_auth.SECRET_ENV, raising=False)
    assert main(["serve", str(tiny_llama), "--role", "decode", "--port", "0"]) == 2
    assert "needs its deployment's internal secret" in capsys.readouterr().err
    f = tmp_path / "secret"
    f.write_text("0123456789abcdef0123456789abcdef\n")
    f.chmod(0o644)
    assert main(["serve", str(tiny_llama), "--role", "prefill", "--port", "0", "--internal-secret-file", str(f)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    f.chmod(0o600)
    assert deployment_secret(str(f), "decode") == b"0123456789abcdef0123456789abcdef"
    monkeypatch.setenv(internal_auth.SECRET_ENV, (b"e" * 32).hex())  # what a launcher hands its workers
    assert deployment_secret(str(f), "decode") == b"e" * 32 and internal_auth.SECRET_ENV not in os.environ


def test_a_decode_worker_that_issues_no_transfer_still_answers(tiny_llama, caplog):
    """Its ids all refused (none may be outstanding): each request is computed whole on the decode
    worker, with the co-located answer."""
    from disagg_helpers import front_over
    prefill, pw = worker_server(tiny_llama, "prefill", "auto")
    decode, dw = worker_server(tiny_llama, "decode", "auto", max_expected=0)
    coloc, _ = worker_server(tiny_llama, "colocated", "auto")
    front = front_over([prefill], [decode])
    try:
        body = {"model": str(tiny_llama), "prompt": "hello there", "max_tokens": 6, "temperature": 0,
                "ignore_eos": True}
        got = httpx.post(front.url + "/v1/completions", json=body, timeout=SAFETY_S).json()["choices"][0]["text"]
        want = httpx.post(coloc.url + "/v1/completions", json=body, timeout=SAFETY_S).json()["choices"][0]["text"]
        assert got == want
        assert front.front.pd.counts.failed == 1 and attach(dw.engine).stats.adopted == 0
        assert pw.counts["sent"] == 0  # nothing was prefilled for a transfer nobody expects
        _refused(caplog, "0 transfers already outstanding")
    finally:
        front.stop()
        for s in (prefill, decode, coloc):
            s.stop()
        pw.close()
        dw.close()


def test_internal_connections_are_kept_open_and_renewed(monkeypatch):
    """One handshake for many calls; a connection its server closed is replaced, and a call that finds
    out only once it has sent on it is made again on a new one (its server never saw it)."""
    from ridgeline.disagg import sessions
    first = create_connector("tcp", timeout=SAFETY_S, secret=SECRET)
    first.listen(LAYOUT)
    host, port = parse_address(first.address, "tcp")
    pool = SessionPool(SECRET, LABEL_KV, b"test", SAFETY_S)
    try:
        ids = {request_transfer(pool, first.address) for _ in range(3)}
        assert len(ids) == 3 and first.inbox.outstanding == 3 and pool.opened == 1
        first.close()  # its connections with it
        second = create_connector("tcp", timeout=SAFETY_S, secret=SECRET, port=port)
        second.listen(LAYOUT)
        try:
            request_transfer(pool, second.address)
            assert pool.opened == 2
            second.close()
            third = create_connector("tcp", timeout=SAFETY_S, secret=SECRET, port=port)
            third.listen(LAYOUT)
            monkeypatch.setattr(sessions, "_open", lambda sock: True)  # the close is noticed only by the call
            request_transfer(pool, third.address)
            assert pool.opened == 3 and third.inbox.outstanding == 1
            third.close()
        finally:
            second.close()
    finally:
        pool.close()
        first.close()
