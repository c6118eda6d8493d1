"""Prefix cache through the Scheduler: admission hits, readmission after preemption, n > 1, and a
property test driving random schedules while checking integrity and the KV each step would read."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ridgeline.config import SchedulerConfig
from ridgeline.engine.kv_manager import KVCacheManager
from ridgeline.engine.request import Request, Status
from ridgeline.engine.scheduler import Scheduler
from ridgeline.sampling_params import SamplingParams


def req(rid, prompt, max_tokens=8, salt=None, share_from=None):
    return Request(rid, list(prompt), SamplingParams(), max_tokens, cache_salt=salt, share_from=share_from)


def step(s: Scheduler, token=7):
    plan = s.schedule()
    s.advance()
    by_id = {r.request_id: r for r in s.running}
    for seq in plan.seqs:
        if seq.sample:
            by_id[seq.req_id].token_ids.append(token)
    return plan


def test_admission_starts_after_the_cached_prefix():
    kv = KVCacheManager(32, 4, enable_caching=True)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64), kv)
    a = req("a", range(1, 19))
    s.add(a)
    step(s)
    s.finish(a, Status.FINISHED_LENGTH)
    b = req("b", list(range(1, 13)) + [50, 51])
    s.add(b)
    plan = step(s)
    assert (plan.seqs[0].start, plan.seqs[0].num_new) == (12, 2)
    assert kv.tables["b"][:3] == [1, 2, 3] and b.num_cached_tokens == 12
    kv.check_integrity()


def test_preempted_request_is_readmitted_from_its_cached_blocks():
    kv = KVCacheManager(6, 4, enable_caching=True)  # 5 usable blocks
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100), kv)
    s.watermark = 0
    a, b = req("a", range(1, 9)), req("b", range(20, 29))
    s.add(a)
    s.add(b)
    step(s)  # a: [1, 2], b: [3, 4, 5]; full blocks cached
    step(s)  # a needs a third block: b (newest) is preempted; its blocks 3, 4 stay cached
    assert b.status == Status.WAITING and b.num_computed_tokens == 0
    assert list(kv.evictable) == [4, 3]
    s.finish(a, Status.FINISHED_LENGTH)
    plan = step(s)
    seq = plan.seqs[0]
    assert seq.req_id == "b" and seq.start == 8 and seq.num_new == 2  # 9 prompt + 1 generated - 8 cached
    assert kv.tables["b"][:2] == [3, 4] and b.num_cached_tokens == 0  # not served from cache at first
    kv.check_integrity()


def test_n_choices_hit_choice_zeros_prompt_blocks_through_the_cache():
    kv = KVCacheManager(32, 4, enable_caching=True)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=100), kv)
    parent = req("p", range(1, 11))
    child = req("p#1", range(1, 11), share_from=parent)
    s.add(parent)
    s.add(child)
    assert [q.req_id for q in step(s).seqs] == ["p"]  # the child waits for the parent's prompt
    plan = step(s)
    cseq = next(q for q in plan.seqs if q.req_id == "p#1")
    assert (cseq.start, cseq.num_new) == (8, 2) and child.num_cached_tokens == 8
    assert kv.tables["p#1"][:2] == kv.tables["p"][:2] and kv.ref_counts[kv.tables["p"][0]] == 2
    kv.check_integrity()


BASES = [list(range(1, 40)), [3] * 12 + list(range(100, 130)), list(range(200, 230))]


@st.composite
def arrivals(draw):
    base = draw(st.sampled_from(BASES))
    keep = draw(st.integers(1, len(base)))
    tail = draw(st.lists(st.integers(1, 9), max_size=12))
    return (base[:keep] + tail, draw(st.integers(1, 10)), draw(st.sampled_from([None, None, "t1"])),
            draw(st.integers(1, 3)))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), num_blocks=st.integers(8, 40), bs=st.sampled_from([1, 2, 4, 8]),
       budget=st.integers(1, 48), max_seqs=st.integers(1, 6), caching=st.booleans())
def test_random_schedules_keep_integrity_and_read_the_right_kv(data, num_blocks, bs, budget, max_seqs, caching):
    kv = KVCacheManager(num_blocks, bs, enable_caching=caching)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs), kv)
    capacity = (num_blocks - 1) * bs
    slots: dict[tuple[int, int], tuple] = {}  # (block, offset) -> what was computed there
    live: dict[str, Request] = {}

    def kv_of(r: Request, pos: int) -> tuple:  # KV at a position depends on the salt and all tokens up to it
        return (r.cache_salt, tuple(r.token_ids[:pos + 1]))

    for t in range(1000):
        if t < 16:
            for i, (prompt, max_tokens, salt, n) in enumerate(data.draw(st.lists(arrivals(), max_size=2))):
                max_tokens = min(max_tokens, capacity - 1)
                prompt = prompt[:capacity - max_tokens]  # fits the cache alone, as the engine checks
                first = None
                for k in range(n):
                    r = req(f"{t}.{i}#{k}", prompt, max_tokens, salt, share_from=first)
                    first = first or r
                    live[r.request_id] = r
                    s.add(r)
        if live and data.draw(st.integers(0, 9)) == 0:
            victim = live.pop(data.draw(st.sampled_from(sorted(live))))
            s.finish(victim, Status.FINISHED_ABORTED)
        plan = s.schedule()
        assert plan.seqs or not s.has_unfinished, "unfinished requests but nothing scheduled"
        for seq in plan.seqs:  # the runner: attend to positions < start, write start..start+num_new
            r = live[seq.req_id]
            table = kv.tables[seq.req_id]
            assert len(table) * bs >= seq.start + seq.num_new
            for pos in range(seq.start):
                assert slots[table[pos // bs], pos % bs] == kv_of(r, pos), f"{seq.req_id} reads wrong KV at {pos}"
            for pos in range(seq.start, seq.start + seq.num_new):
                slots[table[pos // bs], pos % bs] = kv_of(r, pos)
        s.advance()
        for seq in plan.seqs:
            r = live[seq.req_id]
            if seq.sample:
                r.token_ids.append(sum(r.token_ids[-3:]) % 5 + 1)  # deterministic: generated blocks repeat
                if r.num_output_tokens >= r.max_tokens:
                    s.finish(live.pop(r.request_id), Status.FINISHED_LENGTH)
        kv.check_integrity()
        if t >= 16 and not s.has_unfinished:
            break
    for r in list(live.values()):  # a budget of 1 may leave some: abort them
        s.finish(r, Status.FINISHED_ABORTED)
    kv.check_integrity()
    assert kv.num_used_blocks == 0 and not kv.tables
