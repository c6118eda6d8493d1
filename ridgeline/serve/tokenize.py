"""POST /tokenize, POST /detokenize (vLLM's shapes) and GET /version.

/tokenize takes a `prompt` (text, `add_special_tokens` as on /v1/completions) or chat `messages` (rendered
with the model's template and tokenized as /v1/chat/completions does, `add_generation_prompt` true by
default): {"count", "max_model_len", "tokens"} and, with `return_token_strs`, each token's string.
/detokenize takes `tokens` (ids in the vocabulary): {"prompt": text}. Both name the model like the
generation routes (optional) and run on the server's executor."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from ridgeline.errors import InvalidRequestError
from ridgeline.serve.protocol import ChatMessage, RequestBody
from ridgeline.serve.state import state_of
from ridgeline.version import __version__

router = APIRouter()
MAX_DETOKENIZE = 1 << 20  # token ids one /detokenize may hold


class _Body(RequestBody):
    model: str | None = None


class TokenizeRequest(_Body):
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


def _tokenize(tok, body: TokenizeRequest) -> list[int]:
    if body.messages is not None:
        messages = [m.as_template_input() for m in body.messages]
        return tok.encode_chat(messages, add_generation_prompt=body.add_generation_prompt)
    return tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request):
    state = state_of(request)
    if body.model is not None:
        state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequestError("give one of prompt and messages", "prompt" if body.prompt is None else "messages")
    if body.prompt is not None and state.text_bound is not None:
        state.text_bound.check(body.prompt)
    tok = state.engine.tokenizer
    ids = await state.offload("tokenize", _tokenize, tok, body)
    out = {"count": len(ids), "max_model_len": state.engine.max_model_len, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [tok.id_to_token(i) for i in ids]
    return JSONResponse(out)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request):
    state = state_of(request)
    if body.model is not None:
        state.check_model(body.model)
    vocab = state.engine.tokenizer.vocab_size
    if len(body.tokens) > MAX_DETOKENIZE:
        raise InvalidRequestError(f"tokens: at most {MAX_DETOKENIZE} ids", "tokens")
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequestError(f"tokens: {bad} is not a token id of this model (0 to {vocab - 1})", "tokens")
    text = await state.offload("detokenize", state.engine.tokenizer.decode, body.tokens)
    return JSONResponse({"prompt": text})


async def version(request: Request):
    return JSONResponse({"version": __version__})
