"""Ranks that would compute different things (another version, model or option) are refused right
after the rendezvous, naming the difference; what may differ per rank (the model's path on each
node, progress bars, the rendezvous address) does not count."""
from __future__ import annotations

import multiprocessing as mp
from dataclasses import replace

import pytest
import torch

from ridgeline.config import EngineConfig
from ridgeline.distributed.agreement import check_agreement, differences, fingerprint
from ridgeline.distributed.group import RankContext, free_port, join, leave
from ridgeline.errors import InvalidRequestError


def _config(**kw) -> EngineConfig:
    return EngineConfig.from_kwargs("some-model", **kw)


def test_same_options_agree_and_rank_local_ones_do_not_count():
    a = fingerprint(_config(max_num_seqs=8), None)
    b = fingerprint(replace(_config(max_num_seqs=8, progress=False),
                            model=replace(_config().model, model="/other/node/path")), None)
    assert differences([a, b]) == []


def test_a_different_option_or_version_is_named():
    a, b = fingerprint(_config(max_num_seqs=8), None), fingerprint(_config(max_num_seqs=16), None)
    found = differences([a, a, b])
    assert found == ["rank 2: scheduler.max_num_seqs = 16 (rank 0: 8)"]
    c = dict(a, **{"torch version": "0.0"})
    assert differences([a, c]) == [f"rank 1: torch version = 0.0 (rank 0: {torch.__version__})"]


def _rank(rank: int, port: int, seqs: int, out) -> None:
    try:
        join(RankContext(rank, 2, "127.0.0.1", port), 30, torch.device("cpu"))
        check_agreement(_config(max_num_seqs=seqs), None, 2)
        out.put((rank, "agreed"))
    except InvalidRequestError as e:
        out.put((rank, str(e)))
    finally:
        leave()


@pytest.mark.slow  # starts rank processes
@pytest.mark.parametrize("seqs", [(8, 8), (8, 16)])
def test_two_ranks_check_each_other_after_the_rendezvous(seqs):
    ctx, port = mp.get_context("spawn"), free_port()
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, seqs[r], out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    if seqs[0] == seqs[1]:
        assert got == {0: "agreed", 1: "agreed"}
    else:  # every rank refuses, with the same message
        for msg in got.values():
            assert "the 2 ranks of this launch disagree: rank 1: scheduler.max_num_seqs = 16 (rank 0: 8)" in msg
