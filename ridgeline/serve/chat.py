"""POST /v1/chat/completions"""
from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request

from ridgeline.serve.generate import (Job, Prompt, accept, admitted, compile_structured, request_namespace,
                                      sse_response)
from ridgeline.serve.fields import ignored_header
from ridgeline.serve.json_body import json_response, object_bytes
from ridgeline.serve.limits import TextBound
from ridgeline.serve.logprobs import TokenTexts, chat_logprobs
from ridgeline.serve.protocol import ChatCompletionRequest
from ridgeline.serve.state import state_of
from ridgeline.serve import reasoning
from ridgeline.serve.tools import ToolPlan, plan as tool_plan

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    state = state_of(request)
    params = accept(state, body, "/v1/chat/completions")
    tok = state.engine.tokenizer
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    messages = [m.as_template_input() for m in body.messages]
    extra = reasoning.template_variables(body, tok)  # chat_template_kwargs, reasoning_effort
    tools: ToolPlan | None = None
    if _uses_tools(body):
        tools = await state.offload(rid, tool_plan, body, tok, state.render, params, messages)
        messages, params = tools.messages, tools.params
        extra.update(tools.extra)
    rp, params = reasoning.plan(reasoning.reasoning_format(state.settings.reasoning_parser, tok), tok, params,
                                tools.specials if tools is not None else None, body)
    with admitted(state, 1, params.n) as hold:
        prompt = await state.offload(rid, _prompt, tok, messages, state.render, state.text_bound, extra)
        params = reasoning.after_prompt(rp, prompt.text, params)  # a constraint starts after the reasoning
        await compile_structured(state, params, rid)
        job = await Job.start(state, rid, [prompt], params, body.max_tokens_field,
                              request_namespace(state, request, body.cache_salt), hold)
    head = {"id": rid, "created": int(time.time()), "model": body.model,
            "system_fingerprint": state.system_fingerprint}

    def parser():
        return reasoning.reply_parser(rp, tools)

    if body.stream:
        return sse_response(job, _chunks(job, head, TokenTexts(tok), params.n, body.include_usage, parser),
                            ignored_header(body.model_extra))
    [out] = await job.results(request)
    usage = job.usage()

    def build() -> bytes:
        texts = TokenTexts(tok)
        choices = ({"index": c.index, "message": _message(parsed, c),
                    "logprobs": chat_logprobs(texts, c.logprobs), "finish_reason": _finish(c, parsed)}
                   for c in out.outputs for parsed in [_parsed(parser(), c)])
        return object_bytes({**head, "object": "chat.completion"}, choices, {"usage": usage})

    return await json_response(state, rid, build, ignored_header(body.model_extra))


def _uses_tools(body: ChatCompletionRequest) -> bool:
    return (body.tools is not None or body.tool_choice is not None or body.parallel_tool_calls is not None
            or any(m.role == "tool" or m.tool_calls or m.tool_call_id is not None for m in body.messages))


def _parsed(parser, c):
    """A choice's whole reply through its parser: ((reasoning, content, calls), done), or None (no parser)."""
    if parser is None:
        return None
    return parser.whole(c.token_ids, c.text), parser.done


def _message(parsed, c) -> dict:
    if parsed is None:
        return {"role": "assistant", "content": c.text}
    (thought, content, calls), _ = parsed
    message = {"role": "assistant", "content": content}
    if thought is not None:  # both names: vLLM moved from reasoning_content to reasoning
        message["reasoning_content"] = message["reasoning"] = thought
    if calls:
        message["tool_calls"] = [call.openai() for call in calls]
    return message


def _finish(c, parsed) -> str | None:
    if parsed is None:
        return c.finish_reason
    (_, _, calls), done = parsed
    return "tool_calls" if calls and (done or c.finish_reason == "stop") else c.finish_reason


def _prompt(tok, messages: list[dict], render=None, bound: TextBound | None = None, extra: dict | None = None
            ) -> Prompt:
    """Render and tokenize (on the server's executor: a long conversation takes a while). render: the
    server's bounded renderer (None: in this thread); bound: rendered text longer cannot fit; extra:
    more template variables (tools)."""
    extra = extra or {}
    text = tok.apply_chat_template(messages, render=render, **extra)
    if bound is not None:
        bound.check(text, "messages")
    return Prompt(tok.encode_chat(messages, rendered=text, render=render, **extra), text)  # contents never parse specials


async def _chunks(job: Job, head: dict, texts: TokenTexts, n: int, include_usage: bool, new_parser):
    base = {**head, "object": "chat.completion.chunk"}
    parsers = [new_parser() for _ in range(n)]
    usage = {"usage": None} if include_usage else {}

    def chunk(index: int, delta: dict, logprobs=None, finish: str | None = None) -> dict:
        return {**base, "choices": [{"index": index, "delta": delta, "logprobs": logprobs,
                                     "finish_reason": finish}], **usage}

    for i in range(n):
        yield chunk(i, {"role": "assistant", "content": ""})
    async for out in job:  # deltas
        for c in out.outputs:
            parser = parsers[c.index]
            if parser is not None:
                for delta, logprobs, finish in _parsed_deltas(parser, c, chat_logprobs(texts, c.logprobs)):
                    yield chunk(c.index, delta, logprobs, finish)
            elif c.text or c.logprobs or c.finish_reason:
                yield chunk(c.index, {"content": c.text} if c.text else {}, chat_logprobs(texts, c.logprobs),
                            c.finish_reason)
    if include_usage:
        yield {**base, "choices": [], "usage": job.usage()}


def _delta(event: dict) -> dict:
    if "reasoning" in event:
        return {"reasoning_content": event["reasoning"], "reasoning": event["reasoning"]}
    if "content" in event:
        return {"content": event["content"]}
    return {"tool_calls": [event["tool_call"].delta()]}


def _parsed_deltas(parser, c, logprobs):
    """One engine delta through the choice's parser: (delta, logprobs, finish_reason) chunks, the
    logprobs on the first, the finish reason on the last."""
    events = parser.feed(c.token_ids, c.text)
    if c.finish_reason:
        events += parser.finish()
    deltas = [_delta(e) for e in events]
    finish = c.finish_reason
    if finish and parser.calls and (parser.done or finish == "stop"):
        finish = "tool_calls"
    if not deltas and (logprobs or finish):
        deltas = [{}]
    for k, d in enumerate(deltas):
        yield d, logprobs if k == 0 else None, finish if k == len(deltas) - 1 else None
