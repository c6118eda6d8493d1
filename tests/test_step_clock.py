"""Where a busy engine's time between steps goes (engine/step_clock.py): counted per busy interval, split
into CPU (forward, adopting KV, other), waiting for a core and blocked. Asserts counts and arithmetic,
never a speed."""
from __future__ import annotations

import pytest

from ridgeline import LLM, SamplingParams
from ridgeline.disagg.launch import describe_placement, placement
from ridgeline.engine.step_clock import format_breakdown, per_interval


def test_busy_intervals_are_counted_and_idle_waits_are_not(tiny_llama):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory="2MiB", progress=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = ["hello there, how are you", "xylophones are loud, said she"]  # no shared prefix-cache block
    for run, prompt in enumerate(prompts):  # the idle time between the two runs is in no interval
        engine.add_request(f"r{run}", prompt, params)
        while engine.has_unfinished():
            engine.step()
    t = engine.step_clock.summary()
    # each run: 6 steps (the prompt's, then 5 decodes) -> 5 intervals, the first of which holds the prompt
    assert t["intervals"] == 2 * 5
    assert t["prefill_intervals"] == 2 and t["prompt_tokens"] == sum(len(engine.tokenizer.encode(p)) for p in prompts)
    assert t["seqs"] == 2 * 5 and t["adopt_cpu_s"] == 0.0
    assert t["wall_s"] >= t["forward_wall_s"] > 0 and t["cpu_s"] >= t["forward_cpu_s"] >= 0


def test_breakdown_arithmetic():
    t = {"intervals": 4, "wall_s": 0.4, "cpu_s": 0.2, "runq_s": 0.12, "adopt_cpu_s": 0.02, "forward_cpu_s": 0.16,
         "forward_wall_s": 0.3, "seqs": 10, "prefill_intervals": 1, "prompt_tokens": 512}
    m = per_interval(t)
    assert m["step_ms"] == pytest.approx(100) and m["cpu_ms"] == pytest.approx(50)
    assert m["other_cpu_ms"] == pytest.approx(5) and m["runq_ms"] == pytest.approx(30)
    assert m["blocked_ms"] == pytest.approx(20) and m["batch"] == pytest.approx(2.5)
    line = format_breakdown("decode worker 1", t)
    assert "100.0 ms between steps" in line and "adopting KV 5.0" in line and "waiting for a core 30.0" in line
    assert "25% of steps ran prompt tokens (512 tokens)" in line
    assert "no busy steps" in format_breakdown("x", {"intervals": 0})


def test_workers_get_their_own_cores_when_there_are_enough():
    assert placement(2, True, [0, 1]) == [([0], 1), ([1], 1)]
    assert placement(2, True, [0, 1, 2, 3, 4]) == [([0, 1, 2], 3), ([3, 4], 2)]
    line = describe_placement(1, placement(2, True, [4, 5, 6, 7]), True)
    assert line == "cores     prefill 1: cpu 4-5, 2 threads; decode 1: cpu 6-7, 2 threads"
    # more workers than cores, or --no-pin-cores: shared, cores / workers threads each (at least one)
    assert placement(3, True, [0, 1]) == [([], 1)] * 3
    assert placement(2, False, [0, 1, 2, 3]) == [([], 2)] * 2
    assert "not pinned (--no-pin-cores)" in describe_placement(1, placement(2, False, [0, 1]), False)
    assert "not pinned (3 workers, fewer cores)" in describe_placement(2, placement(3, True, [0, 1]), True)
