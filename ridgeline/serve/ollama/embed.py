"""POST /api/embed and the older POST /api/embeddings on the OpenAI route's embedding (serve/embeddings.py):
last-token pooling of the final hidden state. /api/embed L2-normalizes each vector, as ollama does; the older
route returns the vector as the model computes it. An input longer than the window (options.num_ctx, else
the engine's) is cut to it with truncate (ollama's default) and refused without. Sampling options have no
effect on an embedding; the others are checked as on /api/chat."""
from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ridgeline.errors import InvalidRequestError
from ridgeline.serve.embeddings import MAX_INPUTS, embed_ids
from ridgeline.serve.ollama import options
from ridgeline.serve.ollama.card import resolve
from ridgeline.serve.ollama.protocol import EmbeddingsRequest, EmbedRequest
from ridgeline.serve.state import state_of

router = APIRouter()


async def _ids(state, texts: list[str], truncate: bool, window: int) -> list[list[int]]:
    out = []
    for i, text in enumerate(texts):
        if not truncate and state.text_bound is not None:
            state.text_bound.check(text, f"input[{i}]")
        ids = await state.offload("tokenize", state.engine.encode_prompt, text)
        if not ids:
            raise InvalidRequestError(f"input[{i}]: is empty", "input")
        if len(ids) > window:
            if not truncate:
                raise InvalidRequestError(f"input[{i}]: {len(ids)} tokens, more than the context window of {window}; "
                                          "shorten it or leave truncate true", "input",
                                          code="context_length_exceeded")
            ids = ids[:window]
        out.append(ids)
    return out


def _window(state, opts: dict | None) -> int:
    _, num_ctx = options.translate(opts, state.engine.max_model_len)
    return num_ctx or state.engine.max_model_len


@router.post("/api/embed")
async def embed(body: EmbedRequest, request: Request):
    state = state_of(request)
    start = time.monotonic()
    resolve(state, body.model)
    width = state.engine.arch.hidden_size
    if body.dimensions is not None and body.dimensions != width:
        raise InvalidRequestError(f"dimensions: this model's embeddings have {width} dimensions and cannot be cut to "
                                  f"{body.dimensions} (it is not trained for shorter ones); leave dimensions out",
                                  "dimensions", code="unsupported_parameter")
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not texts:
        raise InvalidRequestError("input: give at least one text", "input")
    if len(texts) > MAX_INPUTS:
        raise InvalidRequestError(f"input: at most {MAX_INPUTS} inputs per request, got {len(texts)}", "input")
    ids = await _ids(state, texts, body.truncate, _window(state, body.options))
    vectors = await state.async_engine.call(lambda eng: embed_ids(eng, ids, True, state.pooling))
    took = int((time.monotonic() - start) * 1e9)
    return JSONResponse({"model": body.model, "embeddings": vectors, "total_duration": took, "load_duration": 0,
                         "prompt_eval_count": sum(len(p) for p in ids)})


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request):
    state = state_of(request)
    resolve(state, body.model)
    window = _window(state, body.options)
    if not body.prompt:
        return JSONResponse({"embedding": []})  # as ollama answers an empty prompt
    ids = await _ids(state, [body.prompt], True, window)
    [vector] = await state.async_engine.call(lambda eng: embed_ids(eng, ids, False, state.pooling))
    return JSONResponse({"embedding": vector})
