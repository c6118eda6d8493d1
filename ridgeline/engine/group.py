"""One user request's choices (n Requests sharing a prompt) and what has been sent of them: the
engine's outputs are deltas (new token ids, text and logprobs since the last output of that
request), built here. A request never emitted before gets everything in its first output, so a
caller that only asks for finished requests still receives them whole."""
from __future__ import annotations

from dataclasses import dataclass, field

from ridgeline.engine.detokenizer import Detokenizer
from ridgeline.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from ridgeline.engine.request import Request


@dataclass
class _Sent:
    tokens: int = 0
    logprobs: int = 0
    finished: bool = False


@dataclass
class RequestGroup:
    prompt: str | None
    prompt_token_ids: list[int]
    members: list[Request]
    detoks: list[Detokenizer]
    logprobs: list[list[TokenLogprob] | None]
    prompt_logprobs: list[TokenLogprob | None] | None = None  # [P]: position 0 has none (nothing before it)
    sent: list[_Sent] = field(default_factory=list)
    prompt_logprobs_sent: bool = False

    def __post_init__(self):
        self.sent = [_Sent() for _ in self.members]

    @property
    def done(self) -> bool:
        return all(r.status.finished for r in self.members)

    def delta(self, request_id: str) -> RequestOutput:
        """What changed since the last delta: the choices with new tokens, text or logprobs, or that
        finished; the prompt logprobs once all are computed."""
        outs = []
        for r, d, lps, sent in zip(self.members, self.detoks, self.logprobs, self.sent):
            fin = r.status.finished
            text = d.take(fin)
            new_tokens = r.token_ids[r.num_prompt_tokens + sent.tokens:]
            new_lps = lps[sent.logprobs:] if lps is not None else None
            if not (text or new_tokens or new_lps or (fin and not sent.finished)):
                continue
            outs.append(CompletionOutput(r.index, text, new_tokens, r.status.value if fin else None,
                                         r.stop_reason, new_lps))
            sent.tokens += len(new_tokens)
            sent.logprobs += len(new_lps) if new_lps is not None else 0
            sent.finished = fin
        first = self.members[0]
        plp = None
        if self.prompt_logprobs is not None and not self.prompt_logprobs_sent and (
                first.num_computed_tokens >= len(self.prompt_logprobs) or self.done):
            plp, self.prompt_logprobs_sent = self.prompt_logprobs, True
        metrics = {"arrival_time": first.arrival_time, "first_token_time": first.first_token_time}
        done = self.done
        spec = None
        if done and first.spec_stats is not None:
            spec = first.spec_stats.copy()
            for r in self.members[1:]:
                spec.add(r.spec_stats)
        return RequestOutput(request_id, self.prompt, self.prompt_token_ids, outs, done,
                             num_cached_tokens=first.num_cached_tokens, metrics=metrics, prompt_logprobs=plp,
                             speculative=spec, num_tier_cached_tokens=first.num_tier_cached_tokens)
