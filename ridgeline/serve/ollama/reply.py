"""ollama's reply shapes: NDJSON lines while streaming (`application/x-ndjson`, one JSON object a line,
done: false), then a last line with done: true, done_reason and the counters; the whole reply is that
last line with the text in it. Durations are nanoseconds: total from admission, prompt_eval from admission
to the first token (queueing included), eval from the first token to the end; load is 0 (the model is
loaded when the server starts)."""
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone

from fastapi.responses import StreamingResponse

from ridgeline.serve.generate import Job, sse_response
from ridgeline.serve.json_body import dumps

NDJSON = "application/x-ndjson"


def created_at() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def done_reason(finish: str | None) -> str:
    """ollama's: "length" when the token limit cut the reply, else "stop" (tool calls included)."""
    return "length" if finish == "length" else "stop"


def counters(job: Job) -> dict:
    now, t, usage = time.monotonic(), job.tracker, job.usage()
    first = t.first if t.first is not None else now
    return {"total_duration": _ns(now - t.arrival), "load_duration": 0,
            "prompt_eval_count": usage["prompt_tokens"], "prompt_eval_duration": _ns(first - t.arrival),
            "eval_count": usage["completion_tokens"], "eval_duration": _ns(now - first)}


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def ollama_call(call: dict) -> dict:
    """An OpenAI tool call (arguments: JSON text) -> ollama's (arguments: an object)."""
    f = call["function"]
    try:
        arguments = json.loads(f["arguments"])
    except ValueError:  # a call cut by max_tokens: its text as written
        arguments = f["arguments"]
    return {"id": call["id"], "function": {"index": call.get("index", 0), "name": f["name"],
                                           "arguments": arguments}}


def chat_piece(delta: dict) -> dict | None:
    """One OpenAI chat delta -> the `message` of an ollama chat line (None: nothing to send)."""
    if "content" in delta:
        return {"message": {"role": "assistant", "content": delta["content"]}}
    if "reasoning" in delta:
        return {"message": {"role": "assistant", "content": "", "thinking": delta["reasoning"]}}
    if "tool_calls" in delta:
        return {"message": {"role": "assistant", "content": "",
                            "tool_calls": [ollama_call(c) for c in delta["tool_calls"]]}}
    return None


def generate_piece(delta: dict) -> dict | None:
    """One OpenAI chat delta -> the fields of an ollama generate line (generate carries no tool calls)."""
    if "content" in delta:
        return {"response": delta["content"]}
    if "reasoning" in delta:
        return {"response": "", "thinking": delta["reasoning"]}
    return None


CHAT_END = {"message": {"role": "assistant", "content": ""}}
GENERATE_END = {"response": ""}


def entries(logprobs) -> list | None:
    """chat_logprobs' JSON ({"content": [{token, logprob, bytes, top_logprobs}], ...}) -> ollama's `logprobs`
    list (the same entries)."""
    return None if logprobs is None else json.loads(logprobs)["content"]


async def lines(job: Job, deltas: AsyncIterator[tuple[dict, str | None, list | None]], model: str,
                piece: Callable[[dict], dict | None], end: dict) -> AsyncIterator[dict]:
    """deltas: (OpenAI delta, finish reason or None, logprob entries or None) -> ollama's lines, the counters
    on the last."""
    finish = None
    async for delta, reason, logprobs in deltas:
        fields = piece(delta)
        if fields is None and logprobs:
            fields = end
        if fields is not None:
            yield {"model": model, "created_at": created_at(), **fields,
                   **({"logprobs": logprobs} if logprobs else {}), "done": False}
        finish = reason or finish
    yield {"model": model, "created_at": created_at(), **end, "done_reason": done_reason(finish), "done": True,
           **counters(job)}


def whole(job: Job, model: str, fields: dict, finish: str | None, logprobs=None) -> dict:
    """The whole reply; logprobs: chat_logprobs' JSON, or None."""
    out = {"model": model, "created_at": created_at(), **fields}
    if logprobs is not None:
        out["logprobs"] = entries(logprobs)
    return {**out, "done_reason": done_reason(finish), "done": True, **counters(job)}


def ndjson_response(job: Job, body_lines: AsyncIterator[dict]) -> StreamingResponse:
    """The job's lines as NDJSON; an error after the status line is sent goes in-band as {"error": ...} (the
    client raises it). The job is closed however the stream ends, so an abandoned one frees its KV at once."""
    return sse_response(job, body_lines, frame=lambda line: dumps(line) + "\n",
                        on_error=lambda e: [{"error": e.message}], done=None, media_type=NDJSON)
