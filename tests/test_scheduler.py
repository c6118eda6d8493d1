"""Token-budget scheduling: chunked prefill, mixed batches, FCFS, preemption of the newest."""
from ridgeline.config import SchedulerConfig
from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.request import Request, Status
from ridgeline.engine.scheduler import Scheduler
from ridgeline.sampling_params import SamplingParams


def req(rid, n_prompt, max_tokens=8):
    return Request(rid, list(range(1, n_prompt + 1)), SamplingParams(), max_tokens)


def run_step(s: Scheduler, sampled_token=7):
    plan = s.schedule()
    s.advance()
    for seq in plan.seqs:
        if seq.sample:
            r = next(r for r in s.running if r.request_id == seq.req_id)
            r.token_ids.append(sampled_token)
    return plan


def test_chunked_prefill_under_budget():
    kv = KVCacheManager(64, 4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4), kv)
    s.add(req("a", 20))
    plans = [run_step(s) for _ in range(3)]
    assert [(p.seqs[0].start, p.seqs[0].num_new, p.seqs[0].sample) for p in plans] == \
        [(0, 8, False), (8, 8, False), (16, 4, True)]
    assert kv.tables["a"] == [1, 2, 3, 4, 5]


def test_prefill_progress_counts_a_long_prompt_chunk_by_chunk():
    from types import SimpleNamespace
    from ridgeline.serve.stats_log import throughput_line
    kv = KVCacheManager(64, 4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4), kv)
    s.add(req("a", 20))
    s.add(req("b", 4))
    seen = []
    for _ in range(4):
        run_step(s)
        seen.append((s.prefill_progress(), s.num_prompt_tokens_scheduled))
    # a's 8-token chunks (b queued behind it for the budget), then a's last 4 beside b's 4: every prompt token once
    assert seen == [((1, 8, 20), 8), ((1, 16, 20), 16), ((0, 0, 0), 24), ((0, 0, 0), 24)]
    stats = SimpleNamespace(kv_blocks_used=3, kv_blocks_total=63, prefill=(1, 2048, 7000))
    line = throughput_line((2048.0, 0.0, 10.0), (0.0, 0.0, 0.0), 0, 1, stats)
    assert line == ("throughput: prompt 204.8 tok/s, generation 0.0 tok/s; 0 running, 1 waiting; KV cache 4.8% used; "
                    "prefill 2,048 of 7,000 prompt tokens (1 request)")


def test_decodes_and_prefill_chunks_share_a_step_decodes_first():
    kv = KVCacheManager(64, 4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=10, max_num_seqs=4), kv)
    s.add(req("a", 3))
    run_step(s)  # a prefilled, one token sampled
    s.add(req("b", 30))
    plan = run_step(s)
    assert [(q.req_id, q.num_new) for q in plan.seqs] == [("a", 1), ("b", 9)]
    assert plan.num_tokens == 10


def test_fcfs_and_max_num_seqs():
    kv = KVCacheManager(64, 4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=2), kv)
    for r in ("a", "b", "c"):
        s.add(req(r, 4))
    plan = run_step(s)
    assert [q.req_id for q in plan.seqs] == ["a", "b"]
    assert [r.request_id for r in s.waiting] == ["c"]


def test_preempts_newest_when_blocks_run_out_and_recomputes_it():
    kv = KVCacheManager(5, 4)  # 4 usable blocks
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=4), kv)
    s.watermark = 0
    a, b = req("a", 8), req("b", 7)
    s.add(a)
    s.add(b)
    run_step(s)  # a: blocks 1,2 ; b: blocks 3,4 ; both sampled a token
    assert kv.tables == {"a": [1, 2], "b": [3, 4]}
    assert a.num_tokens == 9 and b.num_tokens == 8
    plan = run_step(s)  # a needs a 3rd block: b (newest) is preempted
    assert [q.req_id for q in plan.seqs] == ["a"]
    assert b.status == Status.WAITING and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert kv.tables["a"] == [1, 2, 4]
    assert s.waiting[0] is b
    s.finish(a, Status.FINISHED_LENGTH)
    plan = run_step(s)  # b is recomputed from scratch: prompt + its sampled token
    assert plan.seqs[0].req_id == "b" and plan.seqs[0].start == 0 and plan.seqs[0].num_new == 8
    kv.check_integrity()


def test_a_preempted_request_returns_only_when_its_whole_history_fits():
    """Readmitted a chunk at a time into a pool that cannot hold its history, a recomputing request is
    the newest again when the running decodes grow: it waits until all of it fits."""
    kv = KVCacheManager(7, 4)  # 6 usable blocks
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=4), kv)
    s.watermark = 0
    a, b = req("a", 8, max_tokens=50), req("b", 8, max_tokens=50)
    s.add(a)
    s.add(b)
    while b.num_preemptions == 0:
        run_step(s)
    history = b.num_tokens
    assert kv.blocks_for(history) == 4 and b.status == Status.WAITING
    s.config = SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=4)  # chunks of 4 tokens: 1 block
    plan = run_step(s)
    assert kv.num_free_blocks >= 1  # its first chunk would fit ...
    assert [q.req_id for q in plan.seqs] == ["a"] and s.waiting[0] is b and "b" not in kv.tables  # ... it waits
    s.finish(a, Status.FINISHED_LENGTH)
    plan = run_step(s)
    assert [(q.req_id, q.start, q.num_new) for q in plan.seqs] == [("b", 0, 4)]
    assert s.num_preemptions == 1
    kv.check_integrity()


def test_finish_frees_blocks():
    kv = KVCacheManager(16, 4)
    s = Scheduler(SchedulerConfig(), kv)
    r = req("a", 10)
    s.add(r)
    run_step(s)
    s.finish(r, Status.FINISHED_ABORTED)
    assert kv.num_free_blocks == kv.num_usable_blocks
    assert s.schedule().finished_ids == ["a"]
    kv.check_integrity()


def test_n_greater_than_one_children_share_prompt_blocks():
    kv = KVCacheManager(32, 4)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100), kv)
    parent = req("p", 10)
    child = Request("p#1", list(parent.prompt_token_ids), parent.params, 8, share_from=parent)
    s.add(parent)
    s.add(child)
    plan = s.schedule()  # child waits: the parent's prompt is not computed yet
    assert [q.req_id for q in plan.seqs] == ["p"]
    s.advance()
    parent.token_ids.append(5)
    plan = s.schedule()
    child_seq = next(q for q in plan.seqs if q.req_id == "p#1")
    assert child_seq.start == 8 and child_seq.num_new == 2  # 2 full blocks shared, 2 tokens computed
    assert kv.tables["p#1"][:2] == kv.tables["p"][:2]
    assert kv.ref_counts[kv.tables["p"][0]] == 2
    assert child.num_cached_tokens == 8
    kv.check_integrity()


def test_concurrency_peak_and_at_the_first_preemption():
    kv = KVCacheManager(9, 4)  # 8 usable blocks
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=8), kv)
    s.watermark = 0
    reqs = [req(r, 8) for r in "abcd"]  # 2 blocks each: all four fill the pool
    for r in reqs:
        s.add(r)
    run_step(s)
    assert (s.peak_running, s.peak_running_before_preemption, s.running_at_first_preemption) == (4, 4, 0)
    run_step(s)  # each needs a 3rd block: d is preempted with four holding blocks (a and b take its two,
    assert s.num_preemptions == 2 and reqs[3].status == reqs[2].status == Status.WAITING  # then c yields)
    assert (s.peak_running, s.peak_running_before_preemption, s.running_at_first_preemption) == (4, 4, 4)
    for r in list(s.running):
        s.finish(r, Status.FINISHED_LENGTH)
    s.finish(reqs[3], Status.FINISHED_LENGTH)
    for i in range(6):  # one block each: six at once, after the first preemption
        s.add(req(f"e{i}", 2, max_tokens=1))
    run_step(s)
    assert len(s.running) == 6 and s.peak_running == 6
    assert (s.peak_running_before_preemption, s.running_at_first_preemption) == (4, 4)  # frozen at the first
