"""Logged request bodies (one OpenAI-style JSON body per line) -> prompt token ids, as the server
would tokenize them: chat bodies through the model's chat template, completion bodies as given."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ridgeline.errors import RidgelineError
from ridgeline.serve.protocol import ChatCompletionRequest, CompletionRequest


@dataclass
class LoggedPrompt:
    line: int  # 1-based line number in the file
    ids: list[int]
    salt: str | None  # the body's cache_salt


def load_prompts(path: str | Path, tokenizer) -> tuple[list[LoggedPrompt], list[str]]:
    """(prompts in file order, one problem message per line that could not be used)."""
    prompts: list[LoggedPrompt] = []
    problems: list[str] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise RidgelineError(f"cannot read {path}: {e.strerror}") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = _parse(line)
            prompts += [LoggedPrompt(no, ids, body.get("cache_salt")) for ids in _tokenize(body, tokenizer)]
        except (ValueError, ValidationError, RidgelineError) as e:
            problems.append(f"line {no}: {_short(e)}")
    return prompts, problems


def _parse(line: str) -> dict:
    try:
        body = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    body.setdefault("model", "")
    return body


def _tokenize(body: dict, tokenizer) -> list[list[int]]:
    if "messages" in body:
        req = ChatCompletionRequest.model_validate(body)
        text = tokenizer.apply_chat_template([m.as_template_input() for m in req.messages])
        return [tokenizer.encode(text, add_special_tokens=False)]
    if "prompt" in body:
        req = CompletionRequest.model_validate(body)
        return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in req.prompts]
    raise ValueError("neither `messages` (chat) nor `prompt` (completion)")


def _short(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"invalid body: {'.'.join(map(str, err['loc']))}: {err['msg']}"
    if isinstance(e, RidgelineError):
        return e.message
    return str(e).splitlines()[0][:120]
