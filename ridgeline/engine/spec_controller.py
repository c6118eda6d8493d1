"""Goodput controller: how many tokens to draft for each decoding request this step (0 = none).

A request whose drafts are accepted with probability alpha gains alpha^j expected tokens from its
j-th drafted token (kept only if every one before it is), and each drafted token adds a row to the
step. Whether a row pays depends on where the step sits on the roofline: at batch 1 a step reads the
weights once whatever its rows, near the ridge each row costs its share of the compute. So the
controller measures it: `StepCost` keeps the time of decode steps by their row count, and a step's
drafts are the rows whose expected tokens per second beat plain decoding (B tokens in t(B)) by a
margin, best first. Unmeasured row counts are priced pessimistically (time proportional to rows past
the largest measured), so speculation starts only after a probe has measured a larger step. A probe
adds a quarter more rows than the best choice, while that reaches past what is measured, and
only while its budget lasts: 1% of measured step time accrues to it, and each probe spends what it
actually cost over the choice it replaced. Where extra rows are cheap (batch 1) probes run step
after step until k is reached; where they are dear, a probe waits until 1% of the time has paid for
it. The costs are convex in rows (flat, then linear), so once the best choice lies inside the
measured range, probing stops, except that a step size not measured for STALE steps is probed
again and its cost replaced: one slow reading (a noisy neighbour, a page fault) would otherwise
stand for good, since choices that never draft that much never re-measure it.

A proposer may fill fewer slots than allowed (EAGLE's confidence bars stop a chain, lookup finds no
match), and the drafts it does make deep in a chain are the confident ones: so each draft position
is priced by the share of allowed slots filled (its expected rows) and by the acceptance of drafts
made there after accepted ones, relative to the first position's (its expected tokens), both
counted over all requests; a request's own acceptance scales them.

A request the proposer has not drafted for lately first costs a catch-up (an EAGLE head feeding the
rows it missed, a draft model prefilling them): its backlog rows times the measured seconds per
catch-up row. That one-time cost is spread over the steps the request has left (its remaining
tokens over its expected tokens per step, at most HORIZON) and priced into the step that would
start it, so a large batch does not pay a long catch-up for one step of drafting it then drops
(at batch 1 a new prompt's catch-up spread over its reply is about 1% of a step).
"""
from __future__ import annotations

import bisect
import collections
import math
import statistics


class StepCost:
    """Seconds per step vs rows (tokens computed): an exponential moving average per bucket of row
    counts (geometric, `ratio` apart), read through a running maximum so that more rows never look
    cheaper, interpolated linearly between buckets. A reading enters the average clipped to within
    `clip` of it (x 1/clip .. x clip): one stalled step (a page fault, a neighbour's burst: 2x a step
    at batch 1) would otherwise raise a row count's cost by a quarter, and a row count priced too
    dear is chosen rarely, so re-measured rarely; a real change still moves it, a few steps on."""

    def __init__(self, ratio: float = 1.2, weight: float = 0.25, forget_after: int = 200, clip: float = 1.25):
        self.log_ratio = math.log(ratio)
        self.weight = weight
        self.clip = clip
        self.forget_after = forget_after  # steps after which a bucket's average is replaced, not updated
        self.buckets: dict[int, list[float]] = {}  # bucket -> [mean rows, mean seconds]
        self.seen: dict[int, int] = {}  # bucket -> the step it was last measured at
        self._curve: tuple[list[float], list[float]] | None = None

    def observe(self, rows: int, seconds: float, now: int = 0) -> None:
        key = self.key(rows)
        b = self.buckets.get(key)
        if b is None or now - self.seen[key] > self.forget_after:  # new, or too old to average with
            self.buckets[key] = [float(rows), seconds]
        else:
            b[0] += self.weight * (rows - b[0])
            b[1] += self.weight * (min(max(seconds, b[1] / self.clip), b[1] * self.clip) - b[1])
        self.seen[key] = now
        self._curve = None

    def key(self, rows: float) -> int:
        return round(math.log(max(rows, 1)) / self.log_ratio)

    def stale(self, rows: float, now: int, age: int) -> bool:
        """No step of about this many rows measured in the last `age` steps (or never)."""
        return now - self.seen.get(self.key(rows), -age - 1) > age

    @property
    def max_rows(self) -> float:
        return max((b[0] for b in self.buckets.values()), default=0.0)

    def curve(self) -> tuple[list[float], list[float]]:
        """(rows ascending, seconds): the buckets, seconds made non-decreasing in rows, then convex
        (each row costing at least what the rows before it did: the roofline's shape). A running
        maximum alone leaves a flat stretch after one high bucket (a step at 11 rows read 13.4 ms,
        those at 13-15 rows 12.5-13: all 13.4), where extra rows look free although each costs its
        share; spreading the rise over the stretch (the slopes pooled until they never fall) prices
        them at the stretch's mean slope."""
        if self._curve is None:
            rows, secs, top = [], [], 0.0
            for r, s in sorted(self.buckets.values()):
                top = max(top, s)
                rows.append(r)
                secs.append(top)
            self._curve = rows, _convex(rows, secs)
        return self._curve

    def predict(self, rows: float) -> float | None:
        xs, ys = self.curve()
        if not xs:
            return None
        i = bisect.bisect_left(xs, rows)
        if i == 0:
            return ys[0]
        if i == len(xs):
            return ys[-1] * rows / xs[-1]  # past the data: as if every row cost its share (compute-bound)
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - xs[i - 1]) / (xs[i] - xs[i - 1])


def _convex(xs: list[float], ys: list[float]) -> list[float]:
    """ys (non-decreasing in xs) refitted convex through the same first and last point: adjacent
    segments whose slopes fall are pooled into one of their mean slope (pool adjacent violators,
    weighted by width), so every later segment rises at least as steeply as every earlier one."""
    blocks: list[list[float]] = []  # [width, rise, segments] per pooled run of segments
    for i in range(1, len(xs)):
        blocks.append([xs[i] - xs[i - 1], ys[i] - ys[i - 1], 1])
        while len(blocks) > 1 and blocks[-2][1] * blocks[-1][0] > blocks[-1][1] * blocks[-2][0]:
            w, r, n = blocks.pop()
            blocks[-1][0] += w
            blocks[-1][1] += r
            blocks[-1][2] += n
    slopes = [r / w if w > 0 else 0.0 for w, r, n in blocks for _ in range(n)]
    out = list(ys[:1])
    for i, slope in enumerate(slopes, 1):
        out.append(out[-1] + slope * (xs[i] - xs[i - 1]))
    return out


def _count(stats: list[list[float]], j: int, success: bool) -> None:
    """One trial at position j of per-position [trials, successes] counts (grown as needed)."""
    while len(stats) <= j:
        stats.append([0.0, 0.0])
    stats[j][0] += 1
    stats[j][1] += success


class SpecController:
    """Decides k per request per step from StepCost, the drafts' cost and each request's acceptance."""
    PRIOR_WEIGHT = 2.0  # trials the prior counts as, beside a request's own
    STALE = 200  # steps after which a step size's measured cost is probed again (and replaced)
    HORIZON = 128  # steps a catch-up is spread over at most (a request's tokens left may be its max_tokens)
    DRAFT_READINGS = 15  # drafting readings per k the proposer's cost is the median of

    def __init__(self, max_k: int, min_gain: float = 1.05, probe_budget: float = 0.01, probe_frac: float = 0.25,
                 prior: float = 0.6, alpha_weight: float = 0.3):
        self.max_k = max_k
        self.min_gain = min_gain  # predicted goodput must beat plain decoding by this factor
        self.probe_budget, self.probe_frac = probe_budget, probe_frac
        self.alpha_weight = alpha_weight
        self.cost = StepCost(forget_after=self.STALE)
        self.prior = prior  # acceptance of requests not yet measured: the running mean over all requests
        self.prior0 = prior
        # decayed (accepted drafts, trials) per request and over all requests; each step a request's
        # counts lose alpha_weight / 30 of their weight (~100 steps to fade), all requests' a tenth of that
        self._counts: dict[str, tuple[float, float]] = {}
        self._all = (0.0, 0.0)
        self.fade, self.fade_all = 1 - alpha_weight / 30, 1 - alpha_weight / 300
        # per draft position j (0-based), decayed over all requests as the prior is: [slots allowed,
        # slots the proposer drafted into] (a proposer may stop short of k: EAGLE's confidence bars)
        # and [drafts at j tried (every one before it accepted), accepted] (observe_use, observe_acceptance)
        self._use: list[list[float]] = []
        self._deep: list[list[float]] = []
        # seconds the proposer takes for a step drafting up to k tokens per request, by k (its catch-up
        # and first pick are paid whatever k, a chain that stops short costs less than k passes): the
        # median of the last DRAFT_READINGS readings per k, so one stalled reading (a garbage
        # collection: 2.1 ms against 0.32 typical at batch 1) does not price a rarely chosen k out; a
        # k not measured is priced in proportion from the nearest one measured
        self.draft_cost: dict[int, collections.deque] = {}
        self.setup_row = 0.0  # seconds the proposer takes per catch-up row (0: not measured yet)
        self.budget = 0.0  # seconds probes may still cost over the choices they replaced
        self._probe_base: float | None = None  # predicted seconds of the choice the last probe replaced
        self.steps = 0  # decode steps measured

    # ---- measurements --------------------------------------------------------------------------
    def observe_step(self, rows: int, seconds: float) -> None:
        """A step in which every scheduled sequence was a decode (with or without drafts)."""
        self.steps += 1
        self.cost.observe(rows, seconds, self.steps)
        self.budget += self.probe_budget * seconds
        if self._probe_base is not None:
            self.budget -= max(0.0, seconds - self._probe_base)
            self._probe_base = None
        self.budget = min(self.budget, seconds)

    def observe_draft(self, positions: int, seconds: float) -> None:
        """The proposer drafted up to `positions` tokens per request in `seconds`."""
        if positions > 0:
            self.draft_cost.setdefault(positions, collections.deque(maxlen=self.DRAFT_READINGS)).append(seconds)

    def draft_seconds(self, k: int) -> float:
        """The proposer's predicted seconds for a step drafting up to k tokens per request."""
        if k <= 0 or not self.draft_cost:
            return 0.0
        near = k if k in self.draft_cost else min(self.draft_cost, key=lambda j: (abs(j - k), -j))
        return statistics.median(self.draft_cost[near]) * k / near

    def charge(self, seconds: float, rows: int = 0) -> None:
        """One-time drafting work (a proposer catching up on `rows` rows of requests it had not
        drafted for) in a probe step is paid from the probe budget: probing at a large batch, where
        each probe starts new requests drafting, then waits until 1% of step time has paid for it.
        Outside probes the choice already priced the catch-ups it starts (choose()), so they leave
        the budget alone: charged there too, a chained proposer's head catching up after each run of
        lookup drafts kept the budget below zero, so a batch-1 request never probed past 2 rows and
        drafted 1 token a step for good (docs/performance.md). It also measures the seconds per
        catch-up row that choose() prices a backlog with."""
        if self._probe_base is not None:
            self.budget -= seconds
        if rows > 0:
            per = seconds / rows
            self.setup_row = per if not self.setup_row else self.setup_row + 0.25 * (per - self.setup_row)

    def observe_acceptance(self, req_id: str, proposed: int, accepted: int) -> None:
        """A verification is a run of trials that stops at the first rejection: `accepted` successes,
        then one failure unless every draft was accepted. Successes over trials estimate the per-draft
        acceptance of the geometric model choose() prices drafts with (the j-th draft gains alpha^j);
        accepted / proposed would count the drafts after a rejection, never tried, as failures (a draft
        whose first token is accepted 31% of the time read 0.14 when drafting 3 deep)."""
        if proposed:
            trials = accepted + (accepted < proposed)
            hits, n = self._counts.get(req_id, (0.0, 0.0))
            self._counts[req_id] = hits + accepted, n + trials
            self._all = self._all[0] + accepted, self._all[1] + trials
            for j in range(trials):
                _count(self._deep, j, accepted > j)

    def observe_use(self, allowed: list[int], drafted: list[int]) -> None:
        """The proposer drafted drafted[i] tokens where this step's choice allowed allowed[i]. A proposer
        that stops a chain where its own confidence falls (the EAGLE head's bars) leaves later slots
        empty: they cost no row, and the drafts it does make there are better than the geometric
        model's alpha^j (the chain went on only where the head was sure), so choose() prices a slot
        at the rows it is used for and the tokens it has yielded (on the chat workload, batch 1, k = 2:
        the head drafted a second token at about half the steps that allowed one)."""
        for a, d in zip(allowed, drafted):
            for j in range(a):
                _count(self._use, j, j < d)

    def _slots(self, n: int) -> tuple[list[float], list[float]]:
        """Per draft position j < n: (the share of allowed slots the proposer drafted into, the
        acceptance of a draft at j whose predecessors were all accepted, relative to the first
        position's), each with PRIOR_WEIGHT trials of the geometric model (every slot used, every
        position accepted alike) beside its counts."""
        w = self.PRIOR_WEIGHT
        counts = lambda stats, j: stats[j] if j < len(stats) else (0.0, 0.0)  # noqa: E731
        use, rel = [], []
        tried, hit = counts(self._deep, 0)
        first = (hit + w * self.prior0) / (tried + w)
        for j in range(n):
            allowed, made = counts(self._use, j)
            use.append(min((made + w) / (allowed + w), use[-1] if use else 1.0))  # a slot follows the one before
            tried, hit = counts(self._deep, j)
            rel.append((hit + w * first) / (tried + w) / first if j and first > 0 else 1.0)
        return use, rel

    def _age(self, req_ids: list[str]) -> None:
        """Once per step: every count fades (per request, and over all requests for the prior of new
        ones), so an estimate follows recent drafts and, for a request that stopped drafting, drifts
        back towards the prior; the request then drafts again, re-measuring its acceptance instead of
        staying off for good after a few unlucky rejections."""
        for rid in req_ids:
            hits, n = self._counts.get(rid, (0.0, 0.0))
            self._counts[rid] = hits * self.fade, n * self.fade
        self._all = self._all[0] * self.fade_all, self._all[1] * self.fade_all
        for pair in self._use + self._deep:
            pair[0] *= self.fade_all
            pair[1] *= self.fade_all
        self.prior = (self._all[0] + self.PRIOR_WEIGHT * self.prior0) / (self._all[1] + self.PRIOR_WEIGHT)

    def acceptance(self, req_id: str) -> float:
        """The request's per-draft acceptance: its faded counts, with the prior counted as PRIOR_WEIGHT trials."""
        hits, n = self._counts.get(req_id, (0.0, 0.0))
        return (hits + self.PRIOR_WEIGHT * self.prior) / (n + self.PRIOR_WEIGHT)

    def forget(self, req_ids) -> None:
        for rid in req_ids:
            self._counts.pop(rid, None)

    # ---- the decision ----------------------------------------------------------------------------
    def choose(self, req_ids: list[str], caps: list[int], base_rows: int, backlog: list[int] | None = None,
               left: list[int] | None = None) -> list[int]:
        """k for each decoding request (at most caps[i]) in a step of base_rows rows without drafts.
        backlog[i]: rows the proposer must catch up on before drafting for request i (None: none);
        left[i]: tokens request i may still generate (None: HORIZON steps' worth)."""
        self._probe_base = None
        self._age(req_ids)
        ks = [0] * len(req_ids)
        t0 = self.cost.predict(base_rows)
        if t0 is None or not req_ids:
            return ks
        alphas = [min(self.acceptance(r), 0.99) for r in req_ids]
        setup = self._setup(alphas, backlog, left)
        # best first: expected tokens per row, less a catch-up's share in tokens of plain decoding
        less = [0.0] * len(req_ids) if setup is None else [x * base_rows / t0 for x in setup]
        use, rel = self._slots(max(caps, default=0))
        cands = []  # (order key, -j, request, expected tokens of its j-th draft, expected rows)
        for i, c in enumerate(caps):
            through = 1.0  # the chance that drafts 1 .. j are all accepted, where all are made
            for j in range(1, c + 1):
                through *= min(0.99, alphas[i] * rel[j - 1])
                cands.append((through - less[i], -j, i, use[j - 1] * through, use[j - 1]))
        cands.sort(reverse=True)
        rows = [float(base_rows)]  # expected rows of a step with the first n candidates
        for cand in cands:
            rows.append(rows[-1] + cand[4])
        drafting = [self.draft_seconds(k) for k in range(max(caps, default=0) + 1)]  # by the deepest k
        n = self._best(cands, len(req_ids), rows, drafting, t0, setup)
        step = max(1, math.ceil(self.probe_frac * (base_rows + n)))
        # probe past the largest step measured, or a step size not measured for a while (a noisy
        # reading there would otherwise stand for good: choices never drafting that much never
        # re-measure it)
        probe = min(len(cands), n + step)
        most = math.ceil(rows[probe] - 1e-9)  # the rows that step may reach (slots are used a share of the time)
        if self.budget > 0 and n < len(cands) and (most > self.cost.max_rows or
                                                   self.cost.stale(most, self.steps, self.STALE)):
            self._probe_base = self.cost.predict(rows[n])
            n = probe  # measure a step a little past the largest measured
        for cand in cands[:n]:
            ks[cand[2]] += 1
        return ks

    def _setup(self, alphas: list[float], backlog: list[int] | None, left: list[int] | None) -> list[float] | None:
        """Per request, its catch-up's seconds spread over the steps it has left (None: no backlog)."""
        if not backlog or not self.setup_row or not any(backlog):
            return None
        out = []
        for i, rows in enumerate(backlog):
            steps = self.HORIZON if left is None else min(self.HORIZON, max(1.0, left[i] / (1 + alphas[i])))
            out.append(rows * self.setup_row / steps)
        return out

    def _best(self, cands: list[tuple], B: int, rows: list[float], drafting: list[float], t0: float,
              setup: list[float] | None = None) -> int:
        """How many of the candidates (best first) maximise expected tokens per second; 0 unless that
        beats plain decoding by min_gain. rows[n]: the expected rows of a step with the first n;
        drafting[k]: the proposer's seconds for a step drafting up to k; setup[i]: seconds per step
        request i's catch-up adds once it drafts."""
        best_n, best_rate = 0, B / t0
        gained, kmax, counts, started = 0.0, 0, [0] * B, 0.0
        for n, (_, _, i, g, _) in enumerate(cands, 1):
            gained += g
            counts[i] += 1
            kmax = max(kmax, counts[i])
            if setup is not None and counts[i] == 1:
                started += setup[i]
            rate = (B + gained) / (self.cost.predict(rows[n]) + drafting[kmax] + started)
            if rate > best_rate:
                best_n, best_rate = n, rate
            elif rate < 0.8 * best_rate:
                break  # tokens grow ever slower, costs ever faster: no better choice further on
        return best_n if best_rate >= self.min_gain * B / t0 else 0
