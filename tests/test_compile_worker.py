"""The server's grammar compiles go first to a niced child process killed at the deadline: a compile
past it is refused by name and the worker restarts for the next one; the worker's errors are the
in-process compile's; only what compiled there is compiled in process (cached)."""
from __future__ import annotations

import os

import pytest

from ridgeline.config import EngineConfig
from ridgeline.engine.llm_engine import LLMEngine
from ridgeline.errors import InvalidRequestError
from ridgeline.structured_params import StructuredOutputs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def backend(tiny_llama):
    eng = LLMEngine(EngineConfig.from_kwargs(str(tiny_llama), progress=False, dtype="float32", kv_cache_memory="8MiB"))
    b = eng.structured.backend
    b.load(isolated=True)
    yield b
    b._compile_worker.close()


def test_the_worker_runs_at_the_lowest_priority(backend):
    pid = backend._compile_worker._proc.pid
    assert os.getpriority(os.PRIO_PROCESS, pid) == 19 and pid != os.getpid()


def test_a_compile_past_the_deadline_is_killed_and_refused(backend):
    worker = backend._compile_worker
    before, compiles = worker.kills, backend.compiles
    with pytest.raises(InvalidRequestError, match=r"guided_json: compiling it took over") as e:
        backend.prepare(StructuredOutputs(json={**SCHEMA, "title": "slow"}, field="guided_json"), timeout=1e-6)
    assert e.value.param == "guided_json" and e.value.code == "unsupported_parameter"
    assert worker.kills == before + 1 and backend.compiles == compiles  # nothing compiled in process
    backend.prepare(StructuredOutputs(json=SCHEMA), timeout=30)  # a new worker takes the next one
    assert backend.compiles == compiles + 1 and worker._proc.poll() is None


def test_the_workers_errors_are_the_in_process_ones(backend):
    spec = StructuredOutputs(regex="(?=a)b", field="guided_regex")
    with pytest.raises(InvalidRequestError) as isolated:
        backend.prepare(spec, timeout=30)
    backend._cache.clear()
    with pytest.raises(InvalidRequestError) as direct:
        backend.prepare(spec)
    assert isolated.value.message == direct.value.message and "guided_regex" in direct.value.message
