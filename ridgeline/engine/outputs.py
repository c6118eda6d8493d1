"""What the engine returns: one RequestOutput per user request and step, vLLM-shaped. Outputs are
deltas: a CompletionOutput carries the token ids, text and logprobs new since the request's last
output (only the choices that changed appear). `merge` folds a delta into what came before;
`Accumulator` keeps whole outputs for callers that want them."""
from __future__ import annotations

from dataclasses import dataclass, field

from ridgeline.engine.spec_stats import SpecStats


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (the first has none)
    metrics: dict = field(default_factory=dict)  # arrival, first token and finish times (monotonic s)
    # speculative decoding: drafted / accepted tokens (by position), verification steps, draft time,
    # summed over the choices; on the finished output only, and only when speculation is on
    speculative: SpecStats | None = None
    num_tier_cached_tokens: int = 0  # of num_cached_tokens, loaded back from the second KV tier

    def merge(self, later: RequestOutput) -> RequestOutput:
        """This output followed by a later delta of the same request, as one output (new objects)."""
        by_index = {c.index: CompletionOutput(c.index, c.text, list(c.token_ids), c.finish_reason, c.stop_reason,
                                              None if c.logprobs is None else list(c.logprobs)) for c in self.outputs}
        for c in later.outputs:
            old = by_index.get(c.index)
            if old is None:
                by_index[c.index] = CompletionOutput(c.index, c.text, list(c.token_ids), c.finish_reason,
                                                     c.stop_reason, None if c.logprobs is None else list(c.logprobs))
                continue
            old.text += c.text
            old.token_ids += c.token_ids
            if c.logprobs is not None:
                old.logprobs = (old.logprobs or []) + c.logprobs
            old.finish_reason, old.stop_reason = c.finish_reason, c.stop_reason
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids,
                             [by_index[i] for i in sorted(by_index)], later.finished, later.num_cached_tokens,
                             later.prompt_logprobs if later.prompt_logprobs is not None else self.prompt_logprobs,
                             {**self.metrics, **later.metrics},
                             later.speculative if later.speculative is not None else self.speculative,
                             later.num_tier_cached_tokens)


class Accumulator:
    """Whole outputs from deltas, per request id: kept in place, so folding a delta costs its size."""

    def __init__(self):
        self.outputs: dict[str, RequestOutput] = {}

    def add(self, delta: RequestOutput) -> RequestOutput:
        whole = self.outputs.get(delta.request_id)
        if whole is None:  # an own copy: the delta's lists stay the caller's
            self.outputs[delta.request_id] = whole = RequestOutput(
                delta.request_id, delta.prompt, delta.prompt_token_ids, [], num_cached_tokens=delta.num_cached_tokens)
        by_index = {c.index: c for c in whole.outputs}
        for c in delta.outputs:
            old = by_index.get(c.index)
            if old is None:
                old = by_index[c.index] = CompletionOutput(c.index, "", [])
                whole.outputs.append(old)
                whole.outputs.sort(key=lambda o: o.index)
            old.text += c.text
            old.token_ids.extend(c.token_ids)
            if c.logprobs is not None:
                if old.logprobs is None:
                    old.logprobs = []
                old.logprobs.extend(c.logprobs)
            old.finish_reason, old.stop_reason = c.finish_reason, c.stop_reason
        whole.finished = delta.finished
        whole.num_cached_tokens = delta.num_cached_tokens
        whole.num_tier_cached_tokens = delta.num_tier_cached_tokens
        whole.metrics.update(delta.metrics)
        if delta.prompt_logprobs is not None:
            whole.prompt_logprobs = delta.prompt_logprobs
        if delta.speculative is not None:
            whole.speculative = delta.speculative
        return whole
