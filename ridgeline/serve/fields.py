"""The one table of request fields that name a peer's feature (OpenAI's, vLLM's, SGLang's,
llama.cpp's) which Ridgeline does not honour. Each is refused with a 400 naming it unless it is
absent, null, or one of its "off" values; once a feature is enforced its fields become fields of
the request models (serve/protocol.py) and leave this table. A few fields have no effect on the
output by their own definition (a tag, an id for abuse monitoring): ACCEPTED lists them with the
reason. Anything in neither place nor in a model is unknown: ignored, with a warning in the log
and in the `x-ridgeline-ignored-fields` response header.

Nested fields are named with a path: `stream_options.continuous_usage_stats`, `messages[].tool_calls`."""
from __future__ import annotations

from typing import Any, NamedTuple

from ridgeline.errors import InvalidRequestError
from ridgeline.http.headers import IGNORED_FIELDS

IGNORED_HEADER = IGNORED_FIELDS


class Peer(NamedTuple):
    off: tuple  # values that mean "not asked for" (null always does)
    feature: str  # what is missing, in the user's words (refused on every route whose model lacks the field)


_TOOLS = "tool calling"
_REASONING = "reasoning models (separate reasoning content, effort, budgets)"
_TEMPLATE = "chat template options"
_MM = "vision and audio inputs and outputs"
_LORA = "LoRA adapters"

REFUSED: dict[str, Peer] = {
    # OpenAI
    "tools": Peer(([],), _TOOLS),
    "tool_choice": Peer(("none",), _TOOLS),
    "parallel_tool_calls": Peer((), _TOOLS),
    "functions": Peer(([],), "function calling"),
    "function_call": Peer(("none",), "function calling"),
    "suffix": Peer(("",), "insertion with a suffix"),
    "audio": Peer((), _MM),
    "modalities": Peer((["text"],), _MM),
    "prediction": Peer((), "predicted outputs"),
    "web_search_options": Peer((), "web search"),
    "reasoning_effort": Peer((), _REASONING),
    "verbosity": Peer((), "output verbosity"),
    "store": Peer((False,), "stored completions"),
    "service_tier": Peer(("auto", "default"), "service tiers"),
    # vLLM
    "guided_whitespace_pattern": Peer((), "a whitespace pattern for JSON (JSON is compact)"),
    "use_beam_search": Peer((False,), "beam search"),
    "length_penalty": Peer((1.0,), "beam search"),
    "spaces_between_special_tokens": Peer((True,), "detokenizing without spaces between special tokens"),
    "truncate_prompt_tokens": Peer((), "prompt truncation"),
    "prompt_logprobs": Peer((), "prompt logprobs by this name (completions: echo with logprobs)"),
    "allowed_token_ids": Peer((), "allowed token ids"),
    "bad_words": Peer(([],), "bad words"),
    "echo": Peer((False,), "echoing the last message on chat (completions take echo)"),
    "top_logprobs": Peer((), "top_logprobs on completions (there: logprobs = N)"),
    "max_completion_tokens": Peer((), "max_completion_tokens on completions (there: max_tokens)"),
    "add_generation_prompt": Peer((True,), _TEMPLATE),
    "continue_final_message": Peer((False,), _TEMPLATE),
    "add_special_tokens": Peer((), _TEMPLATE),
    "documents": Peer(([],), _TEMPLATE),
    "chat_template": Peer((), _TEMPLATE),
    "chat_template_kwargs": Peer(({},), _TEMPLATE),
    "mm_processor_kwargs": Peer(({},), _MM),
    "media_io_kwargs": Peer(({},), _MM),
    "prompt_embeds": Peer((), "prompt embeddings"),
    "priority": Peer((0,), "priority scheduling"),
    "request_id": Peer((), "client-chosen request ids"),
    "logits_processors": Peer(([],), "logits processors"),
    "return_tokens_as_token_ids": Peer((False,), "tokens as token ids in logprobs"),
    "return_token_ids": Peer((False,), "token ids in the response"),
    "kv_transfer_params": Peer((), "vLLM's KV transfer (Ridgeline disaggregates with its own workers)"),
    "vllm_xargs": Peer(({},), "vLLM's extension arguments"),
    "include_reasoning": Peer((True,), _REASONING),
    "thinking_token_budget": Peer((), _REASONING),
    "max_reasoning_tokens": Peer((), _REASONING),
    "lora_request": Peer((), _LORA),
    "stream_options.continuous_usage_stats": Peer((False,), "usage on every streamed chunk"),
    "messages[].function_call": Peer((), "function calling"),
    "messages[].audio": Peer((), _MM),
    "messages[].refusal": Peer((), "refusals in assistant messages"),
    # SGLang
    "no_stop_trim": Peer((False,), "keeping the stop string (use include_stop_str_in_output)"),
    "stop_regex": Peer((), "stop regexes"),
    "separate_reasoning": Peer((), _REASONING),
    "stream_reasoning": Peer((), _REASONING),
    "custom_logit_processor": Peer((), "logits processors"),
    "return_hidden_states": Peer((False,), "hidden states in the response"),
    "rid": Peer((), "client-chosen request ids"),
    "session_params": Peer((), "sessions"),
    "lora_path": Peer((), _LORA),
    # llama.cpp
    "n_predict": Peer((), "llama.cpp's spelling of max_tokens (use max_tokens)"),
    "typical_p": Peer((1.0,), "typical sampling"),
    "tfs_z": Peer((1.0,), "tail-free sampling"),
    "mirostat": Peer((0,), "mirostat sampling"),
    "mirostat_tau": Peer((), "mirostat sampling"),
    "mirostat_eta": Peer((), "mirostat sampling"),
    "top_n_sigma": Peer((-1,), "top-n-sigma sampling"),
    "dynatemp_range": Peer((0,), "dynamic temperature"),
    "dynatemp_exponent": Peer((), "dynamic temperature"),
    "repeat_penalty": Peer((), "llama.cpp's spelling of repetition_penalty (use repetition_penalty)"),
    "repeat_last_n": Peer((), "a penalty window"),
    "penalize_nl": Peer((), "a newline penalty"),
    "dry_multiplier": Peer((0,), "DRY sampling"),
    "dry_base": Peer((), "DRY sampling"),
    "dry_allowed_length": Peer((), "DRY sampling"),
    "dry_penalty_last_n": Peer((), "DRY sampling"),
    "dry_sequence_breakers": Peer((), "DRY sampling"),
    "xtc_probability": Peer((0,), "XTC sampling"),
    "xtc_threshold": Peer((), "XTC sampling"),
    "n_probs": Peer((0,), "llama.cpp's spelling of logprobs (use logprobs)"),
    "post_sampling_probs": Peer((False,), "post-sampling probabilities"),
    "samplers": Peer((), "a sampler order"),
    "cache_prompt": Peer((True,), "turning the prefix cache off per request"),
    "id_slot": Peer((-1,), "llama.cpp's slots"),
    "n_keep": Peer((), "context shifting"),
    "t_max_predict_ms": Peer((), "a time limit on generation"),
}

# no effect on the output by their definition: accepted, never a warning
ACCEPTED: dict[str, str] = {
    "metadata": "tags for a stored completion; nothing is stored (store is refused)",
    "safety_identifier": "an id for abuse monitoring, as `user`",
    "prompt_cache_key": "a hint for prefix caching; Ridgeline's prefix cache matches prompts by content",
}


def _is_off(value: Any, off: tuple) -> bool:
    # type-exact: True is not 1, and 1.0 is 1 (JSON has one number type)
    return value is None or any(value == o and (type(value) is type(o) or {type(value), type(o)} <= {int, float})
                                for o in off)


def _refuse(name: str, peer: Peer) -> InvalidRequestError:
    return InvalidRequestError(f"{name}: {peer.feature} is not supported yet; leave {name.split('.')[-1]} unset",
                               param=name, code="unsupported_parameter")


def refuse_peer_fields(data: dict, model_fields) -> None:
    """400 on the first field of the table that is set (model_fields: the request model's own fields,
    which are enforced and so never refused)."""
    for name, peer in REFUSED.items():
        head, _, rest = name.partition(".")
        if name.startswith("messages[]."):
            for m in data.get("messages") if isinstance(data.get("messages"), list) else ():
                if isinstance(m, dict) and not _is_off(m.get(name[len("messages[]."):]), peer.off):
                    raise _refuse(name, peer)
        elif rest:
            inner = data.get(head)
            if isinstance(inner, dict) and not _is_off(inner.get(rest), peer.off):
                raise _refuse(name, peer)
        elif name not in model_fields and not _is_off(data.get(name), peer.off):
            raise _refuse(name, peer)


def ignored_fields(extra: dict | None) -> list[str]:
    """The unknown fields of a body (its model_extra): neither enforced, refused nor accepted."""
    return sorted(k for k in (extra or ()) if k not in REFUSED and k not in ACCEPTED)


def ignored_header(extra: dict | None) -> dict[str, str]:
    """The response header naming the ignored fields (empty: none). Names are printable ASCII here:
    anything else is written as \\uXXXX, and the list is cut at 1 KiB."""
    names = ignored_fields(extra)
    if not names:
        return {}
    text = ", ".join(ascii(n)[1:-1] for n in names)
    return {IGNORED_HEADER: text if len(text) <= 1024 else text[:1021] + "..."}
