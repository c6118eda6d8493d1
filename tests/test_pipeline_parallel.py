"""Pipeline parallelism on CPU with gloo, 2 processes: the stage rules, parity with the single-process
engine (logits within a tight bound, greedy tokens equal wherever the top-2 margin exceeds it) with
chunked prefill and several requests in flight, each stage's resident weight bytes, its KV capacity,
options it does not combine with, and a killed stage ending stage 0 with a clear error."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import make_tiny_model
from rank_kill import kill_rank_1
from ridgeline.distributed.memory import resident_weight_bytes
from ridgeline.distributed.stages import (bubble_fraction, microbatch_count, p2p_bytes_per_step, split_rows,
                                          stage_layout)
from ridgeline.entrypoints.llm import LLM
from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams

BOUND = 1e-4  # |logit difference| allowed; the stages run the same kernels on the same rows, so it is 0 here
SHAPES = {  # (architecture, overrides)
    "llama": ("llama", dict(num_hidden_layers=4, num_attention_heads=9, num_key_value_heads=3, hidden_size=144)),
    "qwen2": ("qwen2", dict(num_hidden_layers=3)),  # tied embeddings; 2 layers on stage 0, 1 on stage 1
    "qwen3_moe": ("qwen3_moe", dict(num_hidden_layers=4)),
}
PROMPTS = [list(range(5, 61)), [7, 300, 12, 99, 250, 3, 3, 3, 180, 64, 17], list(range(100, 130)), [9, 8, 7, 6, 5]]


def test_stage_rules():
    a, b = stage_layout(30, 4)[0], stage_layout(30, 4)[3]  # the default model's 30 layers: 8, 8, 7, 7
    assert (a.start, a.stop, b.start, b.stop) == (0, 8, 23, 30) and a.first and b.last
    assert [len(s.layers) for s in stage_layout(30, 4)] == [8, 8, 7, 7]
    assert "embedding" in a.describe() and "LM head" in b.describe()
    with pytest.raises(InvalidRequestError, match="more stages than the model's 2 layers"):
        stage_layout(2, 3)
    assert split_rows([1, 1, 1, 1], 2) == [(0, 2), (2, 4)]
    assert split_rows([1, 1, 30], 2) == [(0, 2), (2, 3)]  # rows, not sequences, balance the parts
    assert split_rows([5], 3) == [(0, 1)]
    assert microbatch_count(None, 2, 64) == 2 and microbatch_count(8, 2, 3) == 3 and microbatch_count(None, 4, 1) == 1
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3) and bubble_fraction(4, 1) == pytest.approx(3 / 4)
    assert p2p_bytes_per_step(576, 10, 2) == 2 * 10 * 576 * 4


def test_advisor_prices_the_pipeline():
    from ridgeline.advisor.parallel_comm import Link, pp_step_comm
    link = Link(latency=1e-4, bandwidth=1e9)
    t, n = pp_step_comm(576, 2, tokens=64, microbatches=2, link=link)
    assert n == 2 * 2 + 1  # (hidden, residual) per micro-batch, then the sampled tokens back
    assert t == pytest.approx(5 * 1e-4 + 2 * 64 * 576 * 4 / 1e9)
    assert pp_step_comm(576, 1, 64, 1, link) == (0.0, 0)


def test_advise_gpus_plans_pipeline_stages():
    from ridgeline.advisor.errors import AdvisorError
    from ridgeline.advisor.hardware import lookup_hardware
    from ridgeline.advisor.memory import kv_needed, weight_bytes
    from ridgeline.advisor.model_config import resolve_spec
    from ridgeline.advisor.pipeline import pipeline_section
    from ridgeline.advisor.scenario import build
    from ridgeline.advisor.workload import Workload
    spec, hw, w = resolve_spec("Llama-3.1-70B"), lookup_hardware("H100-SXM"), Workload(concurrency=16)
    s = build(spec, hw, w, gpus=8, pp=2)
    assert (s.layout.tp, s.layout.pp) == (4, 2)
    sec = pipeline_section(s)
    assert sec.value("bubble") == pytest.approx(1 / 3)
    assert sec.value("p2p_bytes") == 2 * 16 * spec.hidden_size * 4
    per_device = sec.value("stage0_bytes") + sec.value("stage1_bytes")  # each stage over 4 devices
    whole = weight_bytes(spec, "bf16") + kv_needed(spec, w, 16)
    assert per_device * 4 == pytest.approx(whole, rel=0.01)  # the stages' shares add up to the whole
    assert pipeline_section(build(spec, hw, w, gpus=4, pp=1)) is None
    with pytest.raises(AdvisorError, match="more stages than"):
        build(spec, hw, w, pp=96)


def test_bad_pipeline_options(tiny_llama):
    for kw, what in ((dict(tensor_parallel_size=2), "TP x PP"), (dict(speculative_method="ngram"), "speculative"),
                     (dict(expert_parallel=True), "expert parallelism"), (dict(kv_offload="cpu",
                      kv_offload_size=1 << 20), "offload")):
        with pytest.raises(InvalidRequestError, match=what):
            LLM("unused", pipeline_parallel_size=2, **kw)
    with pytest.raises(InvalidRequestError, match="pipeline_parallel_size must be >= 1"):
        LLM("unused", pipeline_parallel_size=0)
    with pytest.raises(InvalidRequestError, match="more stages than the model's 2 layers"):
        LLM(str(tiny_llama), pipeline_parallel_size=3, progress=False)  # before any process starts


def test_serve_refuses_pipeline_with_disaggregation():
    from ridgeline.cli import build_parser
    from ridgeline.serve.cli import _check
    args = build_parser().parse_args(["serve", "--role", "prefill", "--pipeline-parallel-size", "2"])
    with pytest.raises(InvalidRequestError, match="disaggregation"):
        _check(args)


@pytest.fixture(scope="module", params=list(SHAPES))
def tiny(request, tmp_path_factory) -> tuple[str, Path]:
    arch, kw = SHAPES[request.param]
    return request.param, make_tiny_model(tmp_path_factory.mktemp(f"pp-{request.param}"), arch, **kw)


def _greedy_agree(ref_out, pp_out) -> None:
    """Tokens equal up to the first step whose reference top-2 margin is within twice the bound."""
    a, b = ref_out.outputs[0], pp_out.outputs[0]
    for i, tok in enumerate(a.token_ids):
        top = sorted((lp for _, lp in a.logprobs[i].top), reverse=True)
        if len(top) > 1 and top[0] - top[1] <= 2 * BOUND:
            return
        assert b.token_ids[i] == tok, f"step {i}: {b.token_ids} != {a.token_ids}"


def _expected_stage_bytes(model, stage) -> int:
    """What a stage should hold, measured on the one-process model: its layers, the embedding on the
    first stage, the final norm and LM head on the last (a tied head: its packed copy of the table)."""
    m = model.model
    total = sum(resident_weight_bytes(m.layers[i]) for i in stage.layers)
    if stage.first:
        total += resident_weight_bytes(m.embed_tokens)
    if stage.last:
        total += resident_weight_bytes(m.norm) + resident_weight_bytes(model.lm_head)
    return total


@pytest.mark.slow  # starts rank / worker processes
def test_pp2_matches_one_process(tiny):
    name, folder = tiny
    # chunked prefill: the 56-token prompt takes several steps, sharing them with the others' decodes
    kw = dict(dtype="float32", kv_cache_memory=8 << 20, progress=False, max_num_batched_tokens=24)
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=2)
    ref = LLM(str(folder), **kw)
    want = [ref.engine.prompt_logits(p) for p in PROMPTS[:2]]
    want_out = ref.generate(PROMPTS, params, use_tqdm=False)
    ref_model, ref_tokens = ref.engine.runner.model, ref.info.kv_capacity_tokens
    pp = LLM(str(folder), pipeline_parallel_size=2, **kw)
    try:
        for p, w in zip(PROMPTS[:2], want):
            got = pp.engine.prompt_logits(p)
            assert got.shape == w.shape and (got - w).abs().max().item() < BOUND
        pp.engine.runner.reset_pipeline_stats()
        for a, b in zip(want_out, pp.generate(PROMPTS, params, use_tqdm=False)):
            _greedy_agree(a, b)
        stats = pp.engine.runner.pipeline_stats()
        assert [s.stage for s in stats] == [0, 1] and all(0 <= s.bubble <= 1 for s in stats)
        assert stats[0].microbatches > stats[0].steps  # several requests in flight: steps split in two
        assert stats[0].sent_bytes > 0 and stats[1].sent_bytes == 0  # activations flow forward only
        info = pp.info.pipeline_parallel
        for r, (stage, weights, _, tokens) in enumerate(info.stages):
            want_bytes = _expected_stage_bytes(ref_model, stage)
            assert abs(weights - want_bytes) <= 0.01 * want_bytes, (r, weights, want_bytes)
            assert weights < 0.8 * resident_weight_bytes(ref_model)
            assert tokens >= ref_tokens * stage.num_layers // len(stage.layers) - 16  # fewer layers, more tokens
        assert info.one_process_tokens == ref_tokens and info.tokens > ref_tokens
    finally:
        pp.engine.close()


@pytest.mark.slow  # starts rank / worker processes
def test_killed_stage_ends_stage0_with_clear_error(tiny_llama):
    kill_rank_1(tiny_llama, "pipeline_parallel_size", "pipeline_parallel", "pipeline stage 1")


def _stage_pid(server_pid: int) -> int:
    """The worker process (stage 1) the server started."""
    kids = open(f"/proc/{server_pid}/task/{server_pid}/children").read().split()
    assert len(kids) == 1, kids
    return int(kids[0])


@pytest.mark.slow  # starts rank / worker processes
def test_serve_fails_in_flight_requests_when_a_stage_dies(tiny_llama):
    import threading

    import httpx
    from server_helpers import SAFETY_S
    from test_server_cli import Served
    srv = Served(tiny_llama, "--pipeline-parallel-size", "2")
    try:
        stage1 = _stage_pid(srv.proc.pid)
        os.kill(stage1, signal.SIGSTOP)  # the pipeline stalls: the next request stays in flight until the kill
        body, done = [], threading.Event()

        def ask():
            try:
                with httpx.stream("POST", srv.url + "/v1/completions", timeout=SAFETY_S,
                                  json={"model": "tiny", "prompt": "hello", "max_tokens": 8, "stream": True}) as r:
                    body.extend(r.iter_lines())
            finally:
                done.set()
        threading.Thread(target=ask, daemon=True).start()
        deadline = time.monotonic() + SAFETY_S
        while not re.search(r"^ridgeline_num_requests_waiting 1", httpx.get(srv.url + "/metrics").text, re.M):
            assert time.monotonic() < deadline, "the request never arrived"
            time.sleep(0.05)
        os.kill(stage1, signal.SIGKILL)
        assert done.wait(SAFETY_S)
        text = "\n".join(body)
        assert "pipeline stage 1" in text and "died" in text, text
        assert srv.proc.wait(SAFETY_S) == 3
    finally:
        srv.close()
