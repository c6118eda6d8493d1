"""ollama's `options`, `format` and `think` translated into chat-completion fields, every key sorted into
one of three kinds: honoured (SAMPLING, num_ctx), accepted with no effect (NO_EFFECT: how ollama loads
a model on its own hardware; Ridgeline's server has loaded its one model already) or refused (a 400
naming `options.KEY`). A key in no table is unknown: refused too."""
from __future__ import annotations

from typing import Any

from ridgeline.errors import InvalidRequestError

# ollama's option -> the chat-completion field it becomes
SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
            "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
            "frequency_penalty": "frequency_penalty", "num_predict": "max_tokens"}
NO_EFFECT = {
    "num_gpu": "layers offloaded to a GPU: the server places its model at start-up",
    "main_gpu": "the GPU used: the server places its model at start-up",
    "low_vram": "a memory mode of ollama's runner",
    "num_thread": "CPU threads: the server's own setting",
    "num_batch": "the prompt batch size: the server's --max-num-batched-tokens",
    "numa": "NUMA placement: the server's own setting",
    "use_mmap": "how ollama maps the weights file",
    "use_mlock": "whether ollama locks the weights in memory",
    "f16_kv": "the KV cache format: the server's --kv-cache-dtype",
    "num_keep": "tokens kept when ollama shifts its context: Ridgeline never shifts (a request that does not fit "
                "is a 400)",
}
# accepted only at the value that means "off" (or Ridgeline's own behaviour)
OFF = {"typical_p": (1.0,), "tfs_z": (1.0,), "mirostat": (0,), "repeat_last_n": (-1,), "penalize_newline": (True,),
       "logits_all": (False,), "vocab_only": (False,), "embedding_only": (False,)}
# meaningful only with mirostat on (refused): accepted with no effect while it is off
MIROSTAT_ONLY = ("mirostat_tau", "mirostat_eta")
WHY_OFF = {"typical_p": "typical sampling", "tfs_z": "tail-free sampling", "mirostat": "mirostat sampling",
           "repeat_last_n": "a penalty window (repeat_penalty applies to the whole context: -1)",
           "penalize_newline": "exempting newlines from the penalty", "logits_all": "logits for every position",
           "vocab_only": "loading the vocabulary only", "embedding_only": "an embedding-only load"}


def _bad(key: str, message: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"options.{key}: {message}", f"options.{key}", code=code)


def _num_predict(value) -> int | None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad("num_predict", f"must be an integer, got {ascii(value)[:40]}")
    if value in (-1, -2):  # ollama's "no limit" and "fill the context": both end at the context window
        return None
    if value < 1:
        raise _bad("num_predict", f"must be >= 1, or -1 (no limit), got {value}")
    return value


def _same(value, off) -> bool:
    """Type-exact (true is not 1), but 1.0 is 1: JSON has one number type."""
    return any(value == o and (type(value) is type(o) or {type(value), type(o)} <= {int, float}) for o in off)


def translate(options: dict[str, Any] | None, max_model_len: int) -> tuple[dict, int | None]:
    """(the chat-completion fields the options set, num_ctx or None). Raises a 400 naming options.KEY."""
    fields: dict = {}
    options = options or {}
    for key, value in options.items():
        if value is None:
            continue
        if key in SAMPLING:
            if key == "num_predict":
                value = _num_predict(value)
            elif key == "stop" and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
                raise _bad("stop", "must be a list of strings")
            if value is not None:
                fields[SAMPLING[key]] = value
        elif key == "num_ctx":
            pass
        elif key in NO_EFFECT:
            pass
        elif key in OFF:
            if not _same(value, OFF[key]):
                raise _bad(key, f"{WHY_OFF[key]} is not supported; leave {key} unset", "unsupported_parameter")
        elif key in MIROSTAT_ONLY:
            if options.get("mirostat") not in (None, 0):
                raise _bad("mirostat", "mirostat sampling is not supported", "unsupported_parameter")
        else:
            raise _bad(key, "is not an option this server knows", "unknown_parameter")
    return fields, _num_ctx(options.get("num_ctx"), max_model_len)


def _num_ctx(value, max_model_len: int) -> int | None:
    """num_ctx: a bound the request must fit (prompt + num_predict); above the engine's window it is a 400."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _bad("num_ctx", f"must be a positive integer, got {ascii(value)[:40]}")
    if value > max_model_len:
        raise _bad("num_ctx", f"this server's context window is {max_model_len} tokens, less than {value}; ask for "
                              f"at most {max_model_len} (it is fixed when the server starts: --max-model-len)")
    return value


def response_format(fmt) -> dict | None:
    """ollama's `format`: "json" or a JSON schema object -> chat's response_format ("" or absent: none)."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt, "strict": True}}
    raise InvalidRequestError(f'format: "json" or a JSON schema object, got {ascii(fmt)[:40]}', "format")


def think_fields(think, has_reasoning: bool, template: str | None, model: str) -> dict:
    """ollama's `think` -> chat fields. true: the model must have a reasoning section (else a 400, as ollama
    answers); the template's enable_thinking switch is set where it has one. false: the switch is turned off
    where there is one, and any reasoning the model still writes is left out of the reply. "low" / "medium" /
    "high": reasoning_effort (a 400 where the template takes none). None: the model's default."""
    if think is None:
        return {}
    if isinstance(think, str):
        return {"reasoning_effort": think}
    if not isinstance(think, bool):
        raise InvalidRequestError(f'think: true, false, "low", "medium" or "high", got {ascii(think)[:40]}', "think")
    switch = bool(template) and "enable_thinking" in template
    if think and not has_reasoning:
        raise InvalidRequestError(f'think: "{model}" does not support thinking', "think", code="unsupported_parameter")
    out: dict = {"chat_template_kwargs": {"enable_thinking": think}} if switch else {}
    if not think and has_reasoning:
        out["include_reasoning"] = False
    return out
