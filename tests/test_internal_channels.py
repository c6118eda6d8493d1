"""What the parallel ranks send each other cannot run code or write outside what a rank holds:
- no pickle, torch.load without weights_only, or `*_object` collective anywhere in the package
  (a grep, with a reviewed allowlist; shown failing on a planted line);
- the wire codec decodes only registered types within its frame (a canary pickle decodes to nothing
  and creates no file);
- a follower refuses a call whose indices fall outside what it holds;
- the plan listener of a multi-machine launch refuses peers without the secret (logged) and still
  admits the real followers; a running one-machine TP=2 group listens on nothing but loopback."""
from __future__ import annotations

import logging
import os
import pickle
import re
import socket
import threading
from pathlib import Path

import pytest
import torch

from conftest import make_tiny_model
from ridgeline.distributed import plan_channel, wire, wire_types  # noqa: F401
from ridgeline.distributed.plan_check import Limits, PlanError, check_answer, check_call
from ridgeline.entrypoints.llm import LLM
from ridgeline.sampling_params import SamplingParams
from ridgeline.runner.draft import Draft
from ridgeline.step_plan import SampledSeq, ScheduledSeq, StepPlan
from ridgeline.utils import internal_auth

PACKAGE = Path(__file__).resolve().parent.parent / "ridgeline"
# what the grep refuses: anything that unpickles, or loads a tensor file without weights_only
UNSAFE = re.compile(r"\b(c?pickle|dill|marshal|shelve)\b|allow_pickle\s*=\s*True|_object(_list)?\s*\(|"
                    r"torch\.load\((?![^)]*weights_only\s*=\s*True)")
# file -> why it may name one (each reviewed): none today but Ray's executor, which names no such call
ALLOWED: dict[str, str] = {
    "distributed/frames.py": "its docstring says which collectives it replaces",
    "distributed/wire.py": "its docstring says what it never does",
    "distributed/pipeline.py": "its docstring says it sends no pickle",
}


def unsafe_lines(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if UNSAFE.search(line) and rel not in ALLOWED:
                found.append(f"{rel}:{no}: {line.strip()}")
    return found


def test_nothing_unpickles_and_the_check_can_fail(tmp_path):
    assert unsafe_lines(PACKAGE) == []
    planted = tmp_path / "pkg"
    planted.mkdir()
    (planted / "a.py").write_text("import json\nx = json.loads('1')\n")
    assert unsafe_lines(planted) == []
    for line in ("import pickle", "obj = pickle.loads(data)", "torch.load(path)", "dist.all_gather_object(out, x)",
                 "np.load(f, allow_pickle=True)", "dist.recv_object_list(box, 0)"):
        (planted / "b.py").write_text(line + "\n")
        assert unsafe_lines(planted) == [f"b.py:1: {line}"], line
    (planted / "b.py").write_text("torch.load(path, weights_only=True)\n")
    assert unsafe_lines(planted) == []


def _frame(head: bytes, blobs: bytes = b"") -> bytes:
    return len(head).to_bytes(4, "little") + head + blobs


class Canary:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_the_codec_decodes_only_registered_types(tmp_path):
    canary = tmp_path / "pwned"
    blob = pickle.dumps(Canary(str(canary)))
    for frame in (blob, b"\x05\x00\x00\x00" + blob, wire.encode(1)[:2], b"\xff\xff\xff\x7f{}"):
        with pytest.raises(wire.WireError):
            wire.decode(frame)
    with pytest.raises(wire.WireError, match="not a wire type"):
        wire.decode(_frame(b'{"@":"Canary","v":["/tmp/x"]}'))
    with pytest.raises(wire.WireError, match="does not hold"):
        wire.decode(_frame(b'{"@":"T","dt":"float32","s":[4096],"o":0,"n":16}', bytes(16)))
    with pytest.raises(wire.WireError, match="outside its frame"):
        wire.decode(_frame(b'{"@":"T","dt":"float32","s":[4],"o":0,"n":16}', bytes(12)))
    with pytest.raises(wire.WireError, match="dtype"):
        wire.decode(_frame(b'{"@":"T","dt":"object","s":[1],"o":0,"n":8}', bytes(8)))
    with pytest.raises(wire.WireError):
        wire.decode(_frame(b"[" * 5000 + b"]" * 5000))
    with pytest.raises(TypeError, match="not a wire type"):
        wire.encode(Canary("x"))
    assert not canary.exists()
    params = SamplingParams(temperature=0.5, stop=["x"], logit_bias={3: 1.5}, seed=7)
    plan = StepPlan([ScheduledSeq("r", 4, [5, 6], [0, 1], True, params, 7, [1, 2, 5, 6], 4, kv_moves=[(1, 2)])],
                    ["old"])
    drafts = {"r": Draft([6], torch.rand(2, 5), torch.randint(0, 9, (2, 5)))}
    method, (plan2, drafts2) = wire.decode(wire.encode(("execute", (plan, drafts))))
    assert method == "execute" and plan2 == plan and plan2.seqs[0].params is not params
    assert torch.equal(drafts2["r"].probs, drafts["r"].probs) and torch.equal(drafts2["r"].ids, drafts["r"].ids)
    with pytest.raises(wire.WireError, match="invalid SamplingParams"):  # its own validation runs
        wire.decode(wire.encode(params).replace(b"0.5", b"-10"))  # same length: the frame stays whole


LIM = Limits(vocab=10, num_blocks=4, block_size=2, max_len=8, tier_slots=2)


def _seq(**kw):
    base = dict(req_id="r", start=2, token_ids=[3], block_table=[0, 1], sample=True, params=SamplingParams(),
                seed=None, history=None, num_prompt_tokens=2)
    return ScheduledSeq(**{**base, **kw})


@pytest.mark.parametrize("bad, match", [
    (dict(token_ids=[10]), "token ids outside"),
    (dict(token_ids=[-1]), "token ids outside"),
    (dict(token_ids=[]), "positions"),
    (dict(block_table=[0, 4]), "block ids outside"),
    (dict(block_table=[0]), "block table of 1 blocks for 3 KV slots"),
    (dict(start=7, token_ids=[1, 2], block_table=[0, 1, 2, 3]), "positions 7..9 outside"),
    (dict(cache_start=4, block_table=[0, 1]), "block table of 2 blocks for 5 KV slots"),
    (dict(num_spec=1), "proposal or prompt counts"),
    (dict(history=[1, 11]), "token ids outside"),
    (dict(kv_moves=[(0, 8)]), "KV moves outside"),
    (dict(params=SamplingParams(logit_bias={12: 1.0})), "logit bias outside"),
    (dict(next_token=10), "next prompt token"),
])
def test_a_follower_refuses_indices_outside_what_it_holds(bad, match):
    check_call("execute", (StepPlan([_seq()]), None), LIM)  # the base sequence is fine
    with pytest.raises(PlanError, match=match):
        check_call("execute", (StepPlan([_seq(**bad)]), None), LIM)


def test_a_follower_refuses_other_calls_and_shapes():
    from ridgeline.step_plan import TierCopies
    with pytest.raises(PlanError, match="unknown call"):
        check_call("__init__", (), LIM)
    with pytest.raises(PlanError, match="takes 3 arguments"):
        check_call("prefill_only", ("r", [1]), LIM)
    with pytest.raises(PlanError, match="tier copies outside"):
        check_call("execute", (StepPlan([], kv_copies=TierCopies([(0, 2)])), None), LIM)
    with pytest.raises(PlanError, match="draft probabilities over"):
        check_call("execute", (StepPlan([_seq()]), {"r": Draft([1], torch.rand(1, 9))}), LIM)
    with pytest.raises(PlanError, match="draft token ids"):
        check_call("execute", (StepPlan([_seq()]), {"r": Draft([1], torch.rand(1, 3), torch.full((1, 3), 10))}), LIM)
    check_answer(([SampledSeq("r", [3, 4])], {}), 10)
    with pytest.raises(PlanError, match="token ids outside"):
        check_answer(([SampledSeq("r", [30])], {}), 10)


def test_the_plan_listener_refuses_strangers_and_admits_the_ranks(tmp_path, caplog):
    secret = internal_auth.new_secret()
    listener = plan_channel.listen("127.0.0.1")
    port = listener.getsockname()[1]
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("leader", plan_channel.PlanLeader.over_listener(
        listener, secret, 3, 30)))
    canary = tmp_path / "pwned"
    with caplog.at_level(logging.WARNING, logger="ridgeline.distributed.plan_channel"):
        t.start()
        with socket.create_connection(("127.0.0.1", port)) as s:  # a pickle instead of a handshake
            s.sendall(pickle.dumps(Canary(str(canary))) * 100)
            try:
                s.shutdown(socket.SHUT_WR)
                s.recv(1 << 16)
            except OSError:  # the listener dropped the stranger first (ENOTCONN / ECONNRESET under load)
                pass
        wrong = plan_channel.dial("127.0.0.1", port, 1, 10)  # a peer with another secret
        with pytest.raises(Exception):
            plan_channel.PlanFollower(wrong, b"x" * 32, 1)
        followers = [plan_channel.PlanFollower(plan_channel.dial("127.0.0.1", port, r, 10), secret, r)
                     for r in (1, 2)]
        t.join(30)
    leader = out["leader"]
    refused = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(refused) == 2, refused
    with pytest.raises(OSError):  # listening ended once every rank was in
        socket.create_connection(("127.0.0.1", port), timeout=2)
    lim = Limits(vocab=10, num_blocks=4, block_size=2, max_len=8)
    leader.send("execute", (StepPlan([_seq()]), None))
    for f in followers:
        method, (plan, _) = f.recv(lim)
        assert method == "execute" and plan.seqs[0].token_ids == [3]
    leader.send("execute", (StepPlan([_seq(token_ids=[12])]), None))  # authenticated, but out of range
    with pytest.raises(PlanError):
        followers[0].recv(lim)
    leader.close()
    assert not canary.exists()


def _listening_inodes() -> dict[int, str]:
    """inode -> local "ADDR:PORT" (hex, as /proc/net spells them) of every listening TCP socket (IPv4
    and IPv6) in this network namespace."""
    out = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(name).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                out[int(f[9])] = f[1]
    return out


def _ports(listening: dict[int, str]) -> list[int]:
    return [int(a.split(":")[1], 16) for a in listening.values()]


def _socket_inodes(pid: int) -> set[int]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc/net spells them


def test_a_running_tp2_group_listens_on_loopback_only(tmp_path):
    folder = make_tiny_model(tmp_path, "llama")
    llm = LLM(str(folder), tensor_parallel_size=2, dtype="float32", kv_cache_memory=8 << 20, progress=False)
    try:
        greedy = SamplingParams(max_tokens=4, temperature=0)
        before = llm.generate([[5, 6, 7]], greedy, use_tqdm=False)[0].outputs[0].token_ids
        assert len(before) == 4
        pids = [os.getpid(), *llm.engine.tp.workers.pids]
        listening = _listening_inodes()
        ours = {ino: listening[ino] for pid in pids for ino in _socket_inodes(pid) if ino in listening}
        assert ours and all(addr.split(":")[0] in LOOPBACK for addr in ours.values()), ours  # gloo listens, on loopback
        canary = tmp_path / "pwned"
        for port in _ports(ours):  # what a local user could reach: gloo's loopback listeners
            for payload in (pickle.dumps(Canary(str(canary))), b"\x00" * 65536, b"RLA1" + os.urandom(64)):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                        s.sendall(payload)
                except OSError:
                    pass
        assert llm.generate([[5, 6, 7]], greedy, use_tqdm=False)[0].outputs[0].token_ids == before
        assert not canary.exists()
        rendezvous = llm.engine.tp.folder
        assert os.stat(rendezvous).st_mode & 0o777 == 0o700  # the FileStore: this user's only
    finally:
        llm.engine.close()
    assert not os.path.exists(rendezvous)


def test_the_kv_events_socket_ignores_what_peers_send(tmp_path):
    """KV events only publish: a canary pickle, garbage or a ZeroMQ greeting with junk after it sent to
    the PUB port changes nothing, and a subscriber still gets every message in order."""
    zmq = pytest.importorskip("zmq")
    from ridgeline.serve.kv_publisher import KVEventPublisher
    pub = KVEventPublisher("tcp://127.0.0.1:0", 16)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        port = int(pub.endpoint.rsplit(":", 1)[1])
        canary = tmp_path / "pwned"
        for payload in (pickle.dumps(Canary(str(canary))), os.urandom(4096),
                        b"\xff" + bytes(8) + b"\x7f\x03\x00NULL" + os.urandom(64)):
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(payload)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.setsockopt(zmq.RCVTIMEO, 200)
        sub.connect(pub.endpoint)
        got = None
        for i in range(200):  # a SUB joins a moment after connecting: publish until one arrives
            pub.recorder.stored(bytes([i % 256]) * 32)
            pub.publish()
            try:
                got = sub.recv_multipart()
                break
            except zmq.Again:
                continue
        assert got is not None and got[0] == b"kv"
        assert not canary.exists()
    finally:
        sub.close(0)
        ctx.term()
        pub.close()
