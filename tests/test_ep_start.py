"""`--expert-parallel-size N` refused at start-up, before any rank starts, with a clear error: a
dense model, fewer experts than ranks, more ranks than cores, a torchrun
WORLD_SIZE that is not the size, ranks that never join, and what it does not combine with yet."""
from __future__ import annotations

import os

import pytest
from conftest import make_tiny_model

from ridgeline.cli import main
from ridgeline.distributed.group import free_port
from ridgeline.entrypoints.llm import LLM
from ridgeline.errors import InvalidRequestError

KW = dict(dtype="float32", kv_cache_memory="4MiB", progress=False)


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("ep-start-moe"), "qwen2_moe")  # 6 experts


def _spawned(monkeypatch) -> list:
    """Records every rank a launch would start (none may start in these tests)."""
    started = []
    monkeypatch.setattr("ridgeline.distributed.runtime.Workers", lambda *a, **k: started.append(a))
    return started


def test_a_dense_model_is_refused(tiny_llama, monkeypatch):
    started = _spawned(monkeypatch)
    with pytest.raises(InvalidRequestError, match="expert_parallel_size 2 needs a mixture-of-experts model; "
                                                  "LlamaForCausalLM has no experts"):
        LLM(str(tiny_llama), expert_parallel_size=2, **KW)
    assert started == []


def test_fewer_experts_than_ranks(qwen2_moe, monkeypatch):
    started = _spawned(monkeypatch)
    with pytest.raises(InvalidRequestError, match="6 experts cannot be placed over 8 expert-parallel ranks: every "
                                                  "rank owns at least one expert; use at most 6 ranks"):
        LLM(str(qwen2_moe), expert_parallel_size=8, **KW)
    assert started == []


def test_more_ranks_than_cores_or_than_torchrun_started(qwen2_moe, monkeypatch):
    started = _spawned(monkeypatch)
    monkeypatch.setattr("ridgeline.distributed.ep_runtime.os.sched_getaffinity", lambda pid: {0})
    with pytest.raises(InvalidRequestError, match="expert_parallel_size 2 is larger than the 1 CPU cores"):
        LLM(str(qwen2_moe), expert_parallel_size=2, **KW)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(InvalidRequestError, match="WORLD_SIZE is 3 but expert_parallel_size is 2"):
        LLM(str(qwen2_moe), expert_parallel_size=2, **KW)
    assert started == []


def test_ranks_that_never_join(qwen2_moe, monkeypatch):
    """torchrun's environment names 2 ranks but only this process exists: rank 0 gives up after
    --dist-timeout with an error naming the rendezvous (the other rank can never come: no race)."""
    for k, v in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    from ridgeline.utils import internal_auth
    monkeypatch.setattr(internal_auth, "_DEPLOYMENT", None)  # no secret handed to this process yet
    with pytest.raises(InvalidRequestError, match="needs the same internal secret in every process"):
        LLM(str(qwen2_moe), expert_parallel_size=2, dist_timeout=1.0, **KW)  # no secret: refused before any wait
    monkeypatch.setenv("RIDGELINE_INTERNAL_SECRET", "ab" * 16)
    with pytest.raises(InvalidRequestError, match="did not gather all 2 ranks within 1 s"):
        LLM(str(qwen2_moe), expert_parallel_size=2, dist_timeout=1.0, **KW)


def test_what_it_does_not_combine_with_yet():
    with pytest.raises(InvalidRequestError, match="expert parallelism with tensor_parallel_size > 1 is not supported"):
        LLM("unused", expert_parallel_size=2, tensor_parallel_size=2)
    with pytest.raises(InvalidRequestError, match="expert parallelism with tensor_parallel_size > 1 is not supported"):
        LLM("unused", expert_parallel=True, tensor_parallel_size=2)
    with pytest.raises(InvalidRequestError, match="speculative decoding does not run with expert_parallel_size > 1"):
        LLM("unused", expert_parallel_size=2, speculative_method="ngram")
    with pytest.raises(InvalidRequestError, match="expert_parallel_size must be >= 1"):
        LLM("unused", expert_parallel_size=0)


def test_serve_names_the_error_in_one_line(tiny_llama, capsys):
    assert main(["serve", str(tiny_llama), "--expert-parallel-size", "2", "--port", "0", "--dtype", "float32",
                 "--kv-cache-memory", "4MiB"]) != 0
    err = capsys.readouterr().err
    assert "needs a mixture-of-experts model" in err and "Traceback" not in err
    assert os.environ.get("RANK") is None  # nothing leaked into later tests
