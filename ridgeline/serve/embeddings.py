"""POST /v1/embeddings (OpenAI's shape): one vector per input, the served model's final (normed) hidden state
at the input's last token, L2-normalized (last-token pooling, as vLLM pools a decoder model and as
decoder embedding models such as E5-Mistral and Qwen3-Embedding are trained).

`input` is a string, a list of strings, a list of token ids or a list of such lists; `encoding_format`
`float` or `base64` (little-endian float32, as OpenAI sends it). `dimensions` other than the model's own is
refused: a vector cut short is only meaningful for models trained for it. Each input is one forward outside
the scheduler, run by the step thread between steps (AsyncEngine.call), its KV blocks taken and given back."""
from __future__ import annotations

import base64
import struct

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.errors import InvalidRequestError, PromptTooLongError
from ridgeline.serve.fields import ignored_header
from ridgeline.serve.pooling import pool
from ridgeline.serve.protocol import RequestBody
from ridgeline.serve.state import state_of

router = APIRouter()
MAX_INPUTS = 2048  # inputs per request, as OpenAI allows


class EmbeddingRequest(RequestBody):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None
    normalize: bool = True  # vLLM's: false gives the hidden state as it is
    user: str | None = None


def _inputs(value) -> list[str | list[int]]:
    """The request's inputs, each a text or a list of token ids (checked against the vocabulary later)."""
    if isinstance(value, str):
        items = [value]
    elif value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        items = [list(value)]
    else:
        items = list(value)
    if not items:
        raise InvalidRequestError("input: give at least one text or list of token ids", "input")
    if len(items) > MAX_INPUTS:
        raise InvalidRequestError(f"input: at most {MAX_INPUTS} inputs per request, got {len(items)}", "input")
    for i, item in enumerate(items):
        if (isinstance(item, str) and not item) or (isinstance(item, list) and not item):
            raise InvalidRequestError(f"input[{i}]: is empty", "input")
    return items


def embed_ids(engine, ids: list[list[int]], normalize: bool, mode: str = "last") -> list[list[float]]:
    """On the step thread: each input's hidden states pooled (pooling.py's mode), L2-normalized unless told not to."""
    out = []
    for prompt in ids:
        h = pool(engine.prompt_hidden(prompt), mode)
        out.append((h / h.norm().clamp_min(1e-12) if normalize else h).tolist())
    return out


def _encoded(vector: list[float], fmt: str):
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request):
    state = state_of(request)
    if body.model is not None:
        state.check_model(body.model)
    engine = state.engine
    width = engine.arch.hidden_size
    if body.encoding_format not in ("float", "base64"):
        raise InvalidRequestError(f"encoding_format: 'float' or 'base64', got {body.encoding_format!r}",
                                  "encoding_format")
    if body.dimensions is not None and body.dimensions != width:
        raise InvalidRequestError(f"dimensions: this model's embeddings have {width} dimensions and cannot be cut to "
                                  f"{body.dimensions} (it is not trained for shorter ones); leave dimensions out",
                                  "dimensions", code="unsupported_parameter")
    items = _inputs(body.input)
    for item in items:
        if isinstance(item, str) and state.text_bound is not None:
            state.text_bound.check(item)
    ids = []
    for i, item in enumerate(items):
        try:
            prompt = engine.encode_prompt(item) if isinstance(item, list) else \
                await state.offload("tokenize", engine.encode_prompt, item)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"input[{i}]: {e.message}", "input") from None
        if len(prompt) > engine.max_model_len:
            raise PromptTooLongError(len(prompt), engine.max_model_len)
        ids.append(prompt)
    vectors = await state.async_engine.call(lambda eng: embed_ids(eng, ids, body.normalize, state.pooling))
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    tokens = sum(len(p) for p in ids)
    return JSONResponse({"object": "list", "data": data, "model": state.settings.served_model_name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}},
                        headers=ignored_header(body.model_extra))
