"""What the chat and completion routes share: admission (context and queue limits), a Job that owns
one HTTP request's engine requests until they finish or are aborted, deltas, SSE and usage."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import contextmanager
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from ridgeline.engine.async_engine import RequestStream
from ridgeline.engine.messages import EngineRequest
from ridgeline.engine.cache_namespace import cache_namespace, tenant_salt
from ridgeline.engine.outputs import Accumulator, RequestOutput
from ridgeline.errors import InvalidRequestError, PromptTooLongError
from ridgeline.http.errors import ApiError, error_body, public, status_of
from ridgeline.http.guard import tenant_of
from ridgeline.http.logtext import clean
from ridgeline.sampling_params import SamplingParams
from ridgeline.serve.fields import ignored_fields
from ridgeline.serve.json_body import dumps
from ridgeline.serve.limits import check_logprob_entries, check_n
from ridgeline.serve.metrics import RequestTracker
from ridgeline.serve.state import ServerState
from ridgeline.engine.spec_stats import SpecStats

log = logging.getLogger("ridgeline.serve")
COMPILE_SECONDS = 2.0  # a grammar that takes longer to compile is refused (llguidance's limits bound the work)


@dataclass
class Prompt:
    ids: list[int]
    text: str | None  # the prompt as text, for `echo` and RequestOutput.prompt


def warn_unknown(body: BaseModel, route: str) -> None:
    names = ignored_fields(body.model_extra)
    if names:
        log.warning("%s: ignoring unknown field(s): %s", route, clean(", ".join(names)))


def accept(state, body, route: str):
    """What both generation routes do first: check the model name, warn about unknown fields,
    log the body, and return its SamplingParams (raises on bad values and on n over --max-n)."""
    state.check_model(body.model)
    warn_unknown(body, route)
    state.log_request(body)
    params = body.sampling_params()
    check_n(state.settings.max_n, params)
    return params


async def compile_structured(state: ServerState, params: SamplingParams, name: str) -> None:
    """Structured outputs: compile the request's grammar into the engine's cache on the server's
    executor (never on the event loop or the step thread), within COMPILE_SECONDS once the token
    table and the compile worker are up (a compile past it is killed there and refused); errors name
    the field the client used (StructuredOutputs.field)."""
    if params.structured is None:
        return
    field = params.structured.field
    try:
        backend = state.engine.structured.backend
        await state.offload(name, backend.load, True)  # once per engine: not under the deadline
        # the compile runs first in the backend's worker process, killed at COMPILE_SECONDS; the outer
        # bound is for the second, in-process compile of a grammar that passed there
        await asyncio.wait_for(state.offload(name, backend.prepare, params.structured, COMPILE_SECONDS),
                               2 * COMPILE_SECONDS)
    except asyncio.TimeoutError:
        raise InvalidRequestError(f"{field}: compiling it took over {COMPILE_SECONDS:g} s; simplify it", field,
                                  code="unsupported_parameter") from None


def request_namespace(state: ServerState, request: Request, cache_salt: str | None) -> str | None:
    """The prefix-cache namespace of an HTTP request: its tenant's (the Guard's word) and the client's salt."""
    tenant = tenant_of(request.scope)
    return cache_namespace(None if tenant is None else tenant_salt(state.cache_secret, tenant), None, cache_salt)


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


def check_admission(state: ServerState, num_prompts: int, n: int) -> int:
    """Every choice of every prompt is a sequence that waits for its first token: prompts x n of them
    count toward --max-waiting, with those of requests still being tokenized (admitted). More than
    the limit in one request can never be admitted (400); more than the room left now is worth
    retrying (429, with Retry-After). Returns the request's sequences."""
    seqs, limit = num_prompts * n, state.settings.max_waiting
    if seqs > limit:
        raise InvalidRequestError(
            f"this request asks for {seqs} sequences ({num_prompts} prompt(s) x n={n}), more than this server "
            f"ever admits at once (--max-waiting {limit}); send fewer prompts or a lower n",
            param="n" if n > 1 else "prompt")
    waiting = state.async_engine.num_waiting_seqs + state.pending_seqs
    if waiting + seqs > limit:
        raise ApiError(429, f"the server is busy: {waiting} sequences are waiting for a first token and this "
                            f"request adds {seqs} (--max-waiting {limit}); retry later", code="rate_limit_exceeded")
    return seqs


class _Hold:
    """A request's sequences held against --max-waiting until the engine counts them itself."""

    def __init__(self, state: ServerState, seqs: int):
        self.state, self.seqs = state, seqs
        state.pending_seqs += seqs  # on the event loop only

    def release(self) -> None:
        self.state.pending_seqs -= self.seqs
        self.seqs = 0


@contextmanager
def admitted(state: ServerState, num_prompts: int, n: int):
    """Hold a request's sequences against --max-waiting from before its prompts are tokenized until
    the engine counts them (Job.start releases the hold in the same event-loop turn in which the
    engine registers them: never counted twice, never not at all), so a flood of prompts gets its
    429s before the tokenizer runs. Raises check_admission's 400 or 429."""
    hold = _Hold(state, check_admission(state, num_prompts, n))
    try:
        yield hold
    finally:
        hold.release()


class ClientDisconnected(ApiError):
    def __init__(self):
        super().__init__(499, "the client closed the connection")


class Job:
    """The engine requests of one HTTP request (one per prompt; n choices each)."""

    def __init__(self, name: str, request_ids: list[str], prompts: list[Prompt], stream: RequestStream,
                 tracker: RequestTracker, quiet: bool, params: SamplingParams):
        self.params = params
        self.name = name
        self.request_ids = request_ids
        self.prompts = prompts
        self.stream = stream
        self.tracker = tracker
        self.quiet = quiet
        self.acc = Accumulator()  # whole outputs so far, from the deltas

    @classmethod
    async def start(cls, state: ServerState, base_id: str, prompts: list[Prompt], params: SamplingParams,
                    max_tokens: tuple[str, int | None], namespace: str | None = None, hold: _Hold | None = None
                    ) -> Job:
        """hold: admitted()'s for these prompts. namespace: the requests' prefix-cache namespace
        (request_namespace)."""
        arrival = time.monotonic()
        max_len = state.engine.max_model_len
        for p in prompts:
            check_context(max_len, p, max_tokens)
        check_logprob_entries(state.settings.max_logprob_entries, params, [len(p.ids) for p in prompts], max_len)
        ids = [base_id] if len(prompts) == 1 else [f"{base_id}-{i}" for i in range(len(prompts))]
        requests = [EngineRequest(rid, p.ids, params, p.text, namespace) for rid, p in zip(ids, prompts)]
        if state.disagg is not None:  # a decode worker: the prompt's KV may come from a prefill worker
            requests = await state.disagg.attach(requests)
        if hold is not None:
            hold.release()  # add() counts them before its first await: this turn of the loop
        try:
            stream = await state.async_engine.add(requests, base_id)
        except BaseException:
            for r in requests:
                if r.kv is not None:
                    r.kv.release()  # idempotent; an engine that took it recomputes instead
            raise
        tracker = state.metrics.track(sum(len(p.ids) for p in prompts), params.n, arrival)
        return cls(base_id, ids, prompts, stream, tracker, state.settings.quiet, params)

    def index_of(self, request_id: str) -> int:
        return self.request_ids.index(request_id)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        """The deltas of this job's requests as they come (each folded into self.acc too)."""
        async for delta in self.stream:
            self.tracker.update(self.acc.add(delta))
            yield delta

    async def results(self, request: Request) -> list[RequestOutput]:
        """Wait for every prompt to finish, in prompt order; abort if the client goes away first."""
        consumer = asyncio.ensure_future(self._drain())
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not consumer.done():
                raise ClientDisconnected()
            outs = consumer.result()
        except BaseException as e:
            self.close(status_of(e) if isinstance(e, Exception) else 499)
            raise
        finally:
            watcher.cancel()
            consumer.cancel()
        self.close(200)
        return outs

    async def _drain(self) -> list[RequestOutput]:
        async for _ in self:
            pass
        return [self.acc.outputs[rid] for rid in self.request_ids]

    def close(self, status: int = 499) -> None:
        """Abort whatever is unfinished (its KV blocks free before the next step); record metrics and,
        the first time, log the request's line. status: the HTTP status it ended with (499: the
        client went away)."""
        self.stream.abort()
        if self.tracker.closed:
            return
        self.tracker.close(self.request_ids, error=status not in (200, 499))
        if not self.quiet:
            t = self.tracker
            ttft = "-" if t.first is None else f"{t.first - t.arrival:.3f}s"
            log.info("%s %d: %d prompt + %d completion tokens, TTFT %s, %.3fs", self.name, status,
                     sum(len(p.ids) for p in self.prompts), sum(t.seen.values()), ttft, time.monotonic() - t.arrival)

    def usage(self) -> dict:
        outs = list(self.acc.outputs.values())
        prompt = sum(len(p.ids) for p in self.prompts)
        completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outs)}}
        tier = sum(o.num_tier_cached_tokens for o in outs)
        if tier:  # an extension: of cached_tokens, those loaded back from the --kv-offload tier
            usage["prompt_tokens_details"]["offload_cached_tokens"] = tier
        specs = [o.speculative for o in outs if o.speculative is not None]
        if specs:  # an extension: what speculative decoding drafted and kept for this request
            total = SpecStats()
            for spec in specs:
                total.add(spec)
            usage["speculative"] = total.summary()
        return usage


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _data_frame(chunk: dict) -> str:
    return f"data: {dumps(chunk)}\n\n"


def _error_chunks(e) -> list[dict]:
    return [error_body(e.message, e.type, e.param, e.code)]


def sse_response(job: Job, chunks: AsyncIterator[dict], headers: dict | None = None, *,
                 frame: Callable[[dict], str] = _data_frame, on_error: Callable[[object], list[dict]] = _error_chunks,
                 done: str | None = "data: [DONE]\n\n", media_type: str = "text/event-stream") -> StreamingResponse:
    """headers: more response headers (the ignored fields' warning). The API's framing: frame writes a
    chunk as text (OpenAI's chat: SSE `data: <json>`; ollama's: a JSON line), on_error gives the in-band
    chunks for an error once the status line is sent (a RidgelineError, already public), done is the closing
    text (None: none)."""
    async def body():
        status = 499  # unless it ends below: the client went away (cancellation, generator closed)
        try:
            async for chunk in chunks:
                yield frame(chunk)
            status = 200
        except Exception as e:  # the status line is sent: report in-band, as OpenAI does
            status, e = status_of(e), public(e)
            for chunk in on_error(e):
                yield frame(chunk)
        finally:  # also on disconnect (cancellation) or generator close: abort and free at once
            job.close(status)
        if done is not None:
            yield done

    return _JobResponse(job, body(), media_type=media_type,
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})


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
