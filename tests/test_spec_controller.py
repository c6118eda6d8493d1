"""The goodput controller against synthetic step costs: it drafts where extra rows are nearly free
(bandwidth-bound), turns speculation off where each row costs its share (compute-bound) or where
drafts are rarely accepted, and its probing stays within its budget."""
from __future__ import annotations

import random

import pytest

from ridgeline.engine.spec_controller import SpecController, StepCost


def test_step_cost_interpolates_never_falls_and_prices_the_unmeasured_pessimistically():
    c = StepCost()
    assert c.predict(4) is None
    c.observe(1, 0.010)
    c.observe(8, 0.012)
    c.observe(4, 0.013)  # noise: more rows never look cheaper than fewer
    assert c.predict(1) == pytest.approx(0.010)
    assert c.predict(0.5) == pytest.approx(0.010)
    assert c.predict(8) == pytest.approx(0.013)
    assert 0.010 < c.predict(2) < 0.013
    assert c.predict(16) == pytest.approx(0.026)  # past the data: proportional to rows
    c.observe(8, 0.024)  # a moving average per bucket, each reading clipped to x1.25 of it
    assert c.buckets[c.key(8)][1] == pytest.approx(0.012 + 0.25 * (0.015 - 0.012))
    for _ in range(20):  # a lasting change still gets through
        c.observe(8, 0.020)
    assert 0.019 < c.predict(8) <= 0.020
    before = c.predict(8)
    c.observe(8, 0.001)  # and a lucky one is clipped too: to /1.25, a quarter of the way
    assert c.predict(8) == pytest.approx(before * (1 - 0.25 * (1 - 1 / 1.25)))


def simulate(ctrl: SpecController, cost, batch: int, alpha: float, steps: int = 600, max_k: int = 4, seed: int = 0):
    """Drive the controller for `steps` steps of `batch` requests whose drafts are each accepted with
    probability alpha. Returns (tokens per second, tokens per second of plain decoding, k per step)."""
    rng = random.Random(seed)
    ids = [f"r{i}" for i in range(batch)]
    tokens = elapsed = 0.0
    ks_seen = []
    for _ in range(steps):
        ks = ctrl.choose(ids, [max_k] * batch, batch)
        rows = batch + sum(ks)
        t = cost(rows)
        ctrl.observe_step(rows, t)
        elapsed += t
        for rid, k in zip(ids, ks):
            acc = 0
            while acc < k and rng.random() < alpha:
                acc += 1
            ctrl.observe_acceptance(rid, k, acc)
            tokens += acc + 1
        ks_seen.append(sum(ks) / batch)
    return tokens / elapsed, batch / cost(batch), ks_seen


def bandwidth_bound(rows):  # weights read once per step: rows nearly free until far past 64
    return 0.010 + 0.00002 * rows


def compute_bound(rows):  # every row costs its share
    return 0.0004 * rows


def roofline(rows):  # flat up to the ridge at 8 rows, then linear
    return 0.004 * max(1.0, rows / 8)


def test_speculates_where_rows_are_nearly_free():
    rate, plain, ks = simulate(SpecController(4), bandwidth_bound, batch=1, alpha=0.8)
    assert rate > 2.5 * plain
    assert sum(k == 4 for k in ks[-100:]) > 95


def test_turns_off_where_each_row_costs_its_share():
    rate, plain, ks = simulate(SpecController(4), compute_bound, batch=64, alpha=0.8)
    assert rate > 0.99 * plain  # never slower than plain decoding by more than the probes' 1%
    assert all(k == 0 for k in ks[-100:])


def test_turns_off_when_drafts_are_rarely_accepted():
    rate, plain, ks = simulate(SpecController(4), bandwidth_bound, batch=1, alpha=0.02)
    assert rate > 0.97 * plain
    assert sum(k > 0 for k in ks[-200:]) < 10


@pytest.mark.parametrize("batch", [1, 4, 16, 64])
def test_follows_the_roofline_by_batch_size(batch):
    rate, plain, ks = simulate(SpecController(4), roofline, batch=batch, alpha=0.7)
    assert rate > 0.98 * plain
    if batch <= 4:
        assert rate > 1.5 * plain
    if batch == 64:
        assert sum(ks[-100:]) == 0


def test_draft_cost_counts():
    """A proposer as slow as a step per drafted position: drafting never pays."""
    ctrl = SpecController(4)
    ctrl.observe_draft(4, 4 * bandwidth_bound(1))
    rate, plain, ks = simulate(ctrl, bandwidth_bound, batch=1, alpha=0.6)
    assert rate > 0.97 * plain


def test_engine_with_the_controller_keeps_greedy_output_and_measures(tiny_llama):
    """Controller on (the default): whatever k it picks, greedy output is the plain engine's; it has
    measured decode steps and, where the rows are cheap enough, drafted."""
    from ridgeline.entrypoints.llm import LLM
    from ridgeline.sampling_params import SamplingParams
    kw = dict(dtype="float32", kv_cache_memory="4MiB", progress=False)
    prompts = ["abc abc abc abc abc abc", "one two one two one two one two", "xyz"]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), **kw).generate(prompts, params, use_tqdm=False)]
    llm = LLM(str(tiny_llama), speculative_method="ngram", num_speculative_tokens=4, ngram_min=1, **kw)
    assert "goodput controller" in llm.info.summary()
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == plain
    ctrl = llm.engine.spec.controller
    assert ctrl is not None and ctrl.cost.buckets
    llm.engine.spec.configure(0, controller=False)  # k = 0: a plain engine
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == plain
    assert llm.engine.spec.controller is None


def test_controller_setting_is_checked():
    from ridgeline.config import SpeculativeConfig
    from ridgeline.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="speculative_controller"):
        SpeculativeConfig(speculative_method="ngram", speculative_controller="maybe")


def test_seeded_random_requests_stay_reproducible_under_the_controller(tiny_llama):
    """The controller's k follows measured time; a seeded random request's draws follow the rows each
    step verifies: it drafts nothing under the controller (and its output is the plain engine's)."""
    from ridgeline.entrypoints.llm import LLM
    from ridgeline.sampling_params import SamplingParams
    kw = dict(dtype="float32", kv_cache_memory="4MiB", progress=False)
    prompts = ["abc abc abc abc abc abc", "one two one two one two one two"]
    seeded = SamplingParams(temperature=0.8, max_tokens=24, seed=3, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(tiny_llama), **kw).generate(prompts, seeded, use_tqdm=False)]
    llm = LLM(str(tiny_llama), speculative_method="ngram", ngram_min=1, **kw)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, seeded, use_tqdm=False)] == plain
    assert llm.engine.spec_stats.proposed == 0


def test_acceptance_is_estimated_per_tried_draft_not_per_proposed():
    """Drafting 3 deep with drafts each accepted 30% of the time: a verification tries drafts only up
    to the first rejection, so the estimate is ~0.3 (accepted / proposed would be ~0.14), and a cheap
    draft of that quality keeps drafting at batch 1 (each drafted row costs 10% of a step)."""
    rng = random.Random(3)
    ctrl = SpecController(3)
    for _ in range(3000):
        ctrl.choose(["r"], [3], 1)  # a step: counts fade (no cost measured yet, so it drafts nothing)
        acc = 0
        while acc < 3 and rng.random() < 0.3:
            acc += 1
        ctrl.observe_acceptance("r", 3, acc)
    assert ctrl.prior == pytest.approx(0.3, abs=0.05) and ctrl.acceptance("r") == pytest.approx(0.3, abs=0.1)

    def cheap_rows(rows):
        return 0.010 * (1 + 0.1 * (rows - 1))
    rate, plain, ks = simulate(SpecController(3), cheap_rows, batch=1, alpha=0.35, max_k=3, steps=800)
    assert sum(k > 0 for k in ks[400:]) > 390 and rate > 1.15 * plain


def test_a_request_that_stopped_drafting_measures_again():
    """Counts fade every step, so a request whose first drafts were all rejected drifts back to the
    prior and drafts again; if its drafts are good after all, it keeps drafting."""
    ctrl = SpecController(4)
    for _ in range(12):
        ctrl.observe_acceptance("r0", 4, 0)  # an unlucky start: twelve rejections in a row
    rate, plain, ks = simulate(ctrl, bandwidth_bound, batch=1, alpha=0.7, steps=600)
    assert sum(k > 0 for k in ks[-100:]) > 95 and rate > 1.8 * plain


def test_one_slow_reading_does_not_stop_drafting_for_good():
    """A 2-row step once measured three times slower (noise): drafting k = 1 then looks like a loss,
    and nothing drafting would re-measure it; the controller probes that step size again once its
    reading is old, and drafts again."""
    ctrl = SpecController(1)
    for _ in range(5):
        ctrl.observe_step(1, bandwidth_bound(1))
    ctrl.observe_step(2, 3 * bandwidth_bound(1))
    rate, plain, ks = simulate(ctrl, bandwidth_bound, batch=1, alpha=0.6, max_k=1, steps=600)
    assert sum(ks[-200:]) > 190 and rate > 1.3 * plain


def _measured(ctrl: SpecController, cost, batch: int, alpha: float) -> None:
    """Warm the controller: step costs measured over the rows it may choose, acceptance alpha."""
    simulate(ctrl, cost, batch, alpha, steps=300)


def test_a_catch_up_is_priced_over_the_steps_a_request_has_left():
    # drafting pays a little here (rows cost a quarter of their share): with no backlog every
    # request drafts; a backlog whose catch-up, spread over the steps left, outweighs that gain
    # starts none, and the same backlog spread over a long reply is worth paying
    def cost(rows, batch=16):
        return 0.0004 * batch + 0.0001 * max(0, rows - batch)
    ctrl = SpecController(max_k=2)
    _measured(ctrl, cost, 16, 0.8)
    ids = [f"r{i}" for i in range(16)]
    assert sum(ctrl.choose(ids, [2] * 16, 16)) > 0
    ctrl.charge(0.05, 1000)  # 50 us per catch-up row
    assert ctrl.setup_row == pytest.approx(5e-5)
    assert sum(ctrl.choose(ids, [2] * 16, 16, [0] * 16, [8] * 16)) > 0  # nothing to catch up
    assert sum(ctrl.choose(ids, [2] * 16, 16, [200] * 16, [8] * 16)) == 0  # 10 ms over ~5 steps each
    assert sum(ctrl.choose(ids, [2] * 16, 16, [200] * 16, [4000] * 16)) > 0  # over HORIZON steps
    # a mix: the requests already caught up draft, those with a backlog and a short reply wait
    ks = ctrl.choose(ids, [2] * 16, 16, [0] * 8 + [200] * 8, [8] * 16)
    assert sum(ks[:8]) > 0 and sum(ks[8:]) == 0


def test_a_new_prompt_at_batch_1_still_drafts():
    ctrl = SpecController(max_k=2)
    _measured(ctrl, bandwidth_bound, 1, 0.6)
    ctrl.charge(0.004, 200)  # a 200-row prompt caught up in 4 ms
    assert ctrl.choose(["new"], [2], 1, [200], [127])[0] > 0


def test_one_stalled_step_does_not_price_a_row_count_out():
    """At batch 1 a step that stalls (2x: a page fault, a neighbour's burst) must not make 3-row steps
    look dear enough to draft one token where two pay: the reading enters the average clipped."""
    ctrl = SpecController(max_k=2)
    simulate(ctrl, bandwidth_bound, batch=1, alpha=0.6, steps=300, max_k=2)
    assert ctrl.choose(["r0"], [2], 1) == [2]
    ctrl.observe_step(3, 2 * bandwidth_bound(3))
    assert ctrl.choose(["r0"], [2], 1) == [2]


def test_the_cost_curve_is_convex_so_rows_past_a_high_reading_are_not_free():
    """One high bucket (11 rows read 13.4 ms where 13-15 rows read 12.5-13) left a flat stretch under
    a running maximum, and drafting rows there looked free although each costs its share."""
    c = StepCost()
    for rows, ms in ((1, 4.3), (3, 5.4), (5, 6.6), (7, 7.1), (9, 10.3), (11, 13.4), (14, 12.8), (16, 13.0),
                     (20, 15.9)):
        c.observe(rows, ms / 1e3)
    xs, ys = c.curve()
    slopes = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    assert all(b >= a - 1e-12 for a, b in zip(slopes, slopes[1:]))  # convex
    assert ys[0] == pytest.approx(0.0043) and ys[-1] == pytest.approx(0.0159)  # through the ends
    assert c.predict(16) - c.predict(13) > 3 * 0.0004  # 3 rows past 13 cost what rows cost here
    assert all(c.predict(r) <= c.predict(r + 1) for r in range(1, 20))


def test_does_not_draft_into_a_flat_stretch_left_by_one_high_reading():
    def cost(rows):  # compute-bound past 8 rows: each row costs its share
        return 0.004 * max(1.0, rows / 8)
    ctrl = SpecController(max_k=2)
    simulate(ctrl, cost, batch=13, alpha=0.6, steps=300, max_k=2)
    for rows in (1, 3, 5, 7, 9, 16):  # the batch's tail, and a larger step, measured too
        ctrl.observe_step(rows, cost(rows))
    for _ in range(30):  # 11-row steps slowed for a while: above what 13-15 rows measured
        ctrl.observe_step(11, 1.4 * cost(11))
    assert ctrl.cost.buckets[ctrl.cost.key(11)][1] > ctrl.cost.buckets[ctrl.cost.key(13)][1]
    ctrl.budget = -1.0  # no probe: the choice itself
    ids = [f"r{i}" for i in range(13)]
    assert sum(ctrl.choose(ids, [2] * 13, 13)) == 0


def test_catch_ups_outside_probes_leave_the_probe_budget_alone():
    """A chained proposer (lookup, then the EAGLE head) makes the head catch up after every run of
    lookup drafts. Charged to the probe budget, those catch-ups kept it below zero and a batch-1
    request never probed past 2 rows: it drafted 1 token a step for good where 3 pay. Only a probe
    step's catch-ups are its cost; the others were priced by the choice that started them."""
    def cost(rows):  # batch 1: extra rows cost a tenth of a step each
        return 0.005 + 0.0005 * (rows - 1)
    ctrl = SpecController(max_k=3)
    rng = random.Random(0)
    ks = []
    for step in range(300):
        k = ctrl.choose(["r0"], [3], 1, [0], [1000])[0]
        ctrl.charge(0.002 if step % 3 == 0 else 0.0, 40 if step % 3 == 0 else 0)  # a catch-up every 3rd step
        ctrl.observe_step(1 + k, cost(1 + k))
        acc = 0
        while acc < k and rng.random() < 0.9:
            acc += 1
        ctrl.observe_acceptance("r0", k, acc)
        ks.append(k)
    assert sum(k == 3 for k in ks[100:]) > 150
    before = ctrl.budget
    ctrl._probe_base = None
    ctrl.charge(0.002, 40)  # outside a probe: only the per-row cost is measured
    assert ctrl.budget == before
    ctrl._probe_base = cost(1)
    ctrl.charge(0.002, 40)  # a probe's catch-up is the probe's cost
    assert ctrl.budget == pytest.approx(before - 0.002)


def test_a_proposer_that_stops_chains_short_is_priced_by_the_slots_it_fills():
    """An EAGLE-like proposer: allowed two drafts, it makes the second only where it is sure (a quarter
    of the time), and such second drafts are accepted 90% of the time after an accepted first (first
    drafts: 50%). Each row costs a quarter of a step. Expected tokens per second: k = 1 1.5 / 13.3 ms
    = 112.8; k = 2 1.6125 / 14.0 ms = 115.0 (2.25 rows). Pricing every allowed slot as a full row
    accepted at the pooled acceptance (0.54, geometric) predicts k = 2 at 115.7 against k = 1 at 119.2
    and drafts one; priced by the rows its slots fill and the acceptance of the drafts made there, the
    controller allows two."""
    rng = random.Random(5)
    ctrl = SpecController(2)

    def cost(rows):
        return 0.010 + 0.0025 * (rows - 1)
    ks_seen = []
    for _ in range(1500):
        k = ctrl.choose(["r"], [2], 1)[0]
        ks_seen.append(k)
        drafted = min(k, 1 + (rng.random() < 0.25))
        if k:
            ctrl.observe_draft(k, 0.0008 + 0.0004 * (drafted - 1))
            ctrl.observe_use([k], [drafted])
        ctrl.observe_step(1 + drafted, cost(1 + drafted))
        acc = 0
        if drafted and rng.random() < 0.5:
            acc = 1 + (drafted == 2 and rng.random() < 0.9)
        if drafted:
            ctrl.observe_acceptance("r", drafted, acc)
    assert sum(k == 2 for k in ks_seen[-300:]) > 270
