"""What the chat and completion routes share: admission (context and queue limits), a Job that owns
one HTTP request's engine requests until they finish or are aborted, deltas, SSE and usage."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from ridgeline.engine.async_engine import NewRequest, RequestStream
from ridgeline.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from ridgeline.errors import InvalidRequestError, PromptTooLongError, RidgelineError
from ridgeline.sampling_params import SamplingParams
from ridgeline.serve.errors import ApiError, error_body
from ridgeline.serve.metrics import RequestTracker
from ridgeline.serve.state import ServerState

log = logging.getLogger("ridgeline.serve")


@dataclass
class Prompt:
    ids: list[int]
    text: str | None  # the prompt as text, for `echo` and RequestOutput.prompt


def warn_unknown(body: BaseModel, route: str) -> None:
    if body.model_extra:
        log.warning("%s: ignoring unknown field(s): %s", route, ", ".join(sorted(body.model_extra)))


def accept(state, body, route: str):
    """What both generation routes do first: check the model name, warn about unknown fields,
    log the body, and return its SamplingParams (raises on bad values)."""
    state.check_model(body.model)
    warn_unknown(body, route)
    state.log_request(body)
    return body.sampling_params()


def check_context(max_model_len: int, prompt: Prompt, max_tokens: tuple[str, int | None]) -> None:
    n = len(prompt.ids)
    if n >= max_model_len:
        raise PromptTooLongError(n, max_model_len)
    name, value = max_tokens
    if value is not None and n + value > max_model_len:
        raise InvalidRequestError(
            f"this model's maximum context length is {max_model_len} tokens, but {n + value} were requested "
            f"({n} in the prompt, {value} in {name}); shorten the prompt or lower {name}",
            param=name, code="context_length_exceeded")


class ClientDisconnected(ApiError):
    def __init__(self):
        super().__init__(499, "the client closed the connection")


class Job:
    """The engine requests of one HTTP request (one per prompt; n choices each)."""

    def __init__(self, request_ids: list[str], prompts: list[Prompt], stream: RequestStream,
                 tracker: RequestTracker):
        self.request_ids = request_ids
        self.prompts = prompts
        self.stream = stream
        self.tracker = tracker
        self.latest: dict[str, RequestOutput] = {}

    @classmethod
    async def start(cls, state: ServerState, base_id: str, prompts: list[Prompt], params: SamplingParams,
                    max_tokens: tuple[str, int | None], cache_salt: str | None = None) -> Job:
        arrival = time.monotonic()
        for p in prompts:
            check_context(state.engine.max_model_len, p, max_tokens)
        ae, limit = state.async_engine, state.settings.max_waiting
        if ae.num_waiting + len(prompts) > limit:
            raise ApiError(429, f"the server is busy: {ae.num_waiting} requests are waiting for a first "
                                f"token (--max-waiting {limit}); retry later", code="rate_limit_exceeded")
        ids = [base_id] if len(prompts) == 1 else [f"{base_id}-{i}" for i in range(len(prompts))]
        stream = await ae.add([NewRequest(rid, p.ids, params, p.text, cache_salt) for rid, p in zip(ids, prompts)])
        tracker = state.metrics.track(sum(len(p.ids) for p in prompts), params.n, arrival)
        return cls(ids, prompts, stream, tracker)

    def index_of(self, request_id: str) -> int:
        return self.request_ids.index(request_id)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        async for out in self.stream:
            self.latest[out.request_id] = out
            self.tracker.update(out)
            yield out

    async def results(self, request: Request) -> list[RequestOutput]:
        """Wait for every prompt to finish, in prompt order; abort if the client goes away first."""
        consumer = asyncio.ensure_future(self._drain())
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not consumer.done():
                raise ClientDisconnected()
            outs = consumer.result()
        except ClientDisconnected:
            self.close()
            raise
        except BaseException:
            self.close(error=True)
            raise
        finally:
            watcher.cancel()
            consumer.cancel()
        self.close()
        return outs

    async def _drain(self) -> list[RequestOutput]:
        async for _ in self:
            pass
        return [self.latest[rid] for rid in self.request_ids]

    def close(self, error: bool = False) -> None:
        """Abort whatever is unfinished (its KV blocks free before the next step); record metrics."""
        self.stream.abort()
        self.tracker.close(self.request_ids, error)

    def usage(self) -> dict:
        outs = list(self.latest.values())
        prompt = sum(len(p.ids) for p in self.prompts)
        completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outs)}}


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Cursor:
    """How much of one choice the client has been sent."""

    def __init__(self):
        self.chars = 0
        self.tokens = 0
        self.done = False

    def advance(self, c: CompletionOutput) -> tuple[str, list[TokenLogprob] | None, str | None] | None:
        """(new text, new logprobs, finish reason or None), or None if there is nothing new to send."""
        if self.done:
            return None
        text = c.text[self.chars:]
        lps = c.logprobs[self.tokens:] if c.logprobs is not None else None
        finish = c.finish_reason
        if not text and not lps and finish is None:
            return None
        self.chars, self.done = len(c.text), finish is not None
        self.tokens = len(c.logprobs) if c.logprobs is not None else 0
        return text, lps, finish


def sse_response(job: Job, chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def body():
        error = False
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        except Exception as e:  # the status line is sent: report in-band, as OpenAI does
            error = True
            if not isinstance(e, RidgelineError):
                log.exception("stream failed")
                e = RidgelineError(f"internal error: {type(e).__name__}: {e}")
            yield f"data: {json.dumps(error_body(e.message, e.type, e.param, e.code))}\n\n"
        finally:  # also on disconnect (cancellation) or generator close: abort and free at once
            job.close(error=error)
        yield "data: [DONE]\n\n"

    return _JobResponse(job, body(), media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _JobResponse(StreamingResponse):
    """Closes the job even when the body generator never starts (client gone before the first byte)."""

    def __init__(self, job: Job, content, **kw):
        super().__init__(content, **kw)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.close()
