"""What one request may make the server spend, checked before the work is done: choices per
request (--max-n), logprob entries in its response (--max-logprob-entries), sequences waiting for a
first token (--max-waiting, counted from before tokenizing: generate.admitted) and text no prompt
that fits the context can be (refused before the tokenizer sees it). The chat template's own bounds
(--chat-template-timeout, --chat-template-max-bytes) are enforced by weights/template_worker.py."""
from __future__ import annotations

from dataclasses import dataclass

from ridgeline.errors import InvalidRequestError
from ridgeline.sampling_params import SamplingParams

MAX_LOGPROB_ENTRIES = 1 << 20  # token logprobs a response may hold: sampled and alternatives, every choice
CHAT_TEMPLATE_TIMEOUT_S = 1.0
CHAT_TEMPLATE_MIN_BYTES = 1 << 20  # the default output cap: this, or the longest prompt that fits if larger


def check_n(max_n: int, params: SamplingParams) -> None:
    if params.n > max_n:
        raise InvalidRequestError(f"n: this server allows at most {max_n} choices per request (--max-n), "
                                  f"got {params.n}", param="n")


def logprob_entries(params: SamplingParams, prompt_lens: list[int], max_model_len: int) -> int:
    """Token logprobs (each sampled or prompt token and its alternatives) a request's response holds
    at most: per prompt and choice, the completion's tokens (max_tokens, or the room left in the
    context) and, with prompt logprobs (echo), the prompt's tokens, repeated in every choice."""
    total = 0
    for length in prompt_lens:
        if params.logprobs is not None:
            tokens = max_model_len - length if params.max_tokens is None else params.max_tokens
            total += params.n * tokens * (1 + params.logprobs)
        if params.prompt_logprobs is not None:
            total += params.n * length * (1 + params.prompt_logprobs)
    return total


def check_logprob_entries(limit: int, params: SamplingParams, prompt_lens: list[int], max_model_len: int) -> None:
    if params.logprobs is None and params.prompt_logprobs is None:
        return
    entries = logprob_entries(params, prompt_lens, max_model_len)
    if entries > limit:
        field = "logprobs" if params.logprobs is not None else "prompt_logprobs"
        raise InvalidRequestError(
            f"this request could return {entries} token logprobs (n x tokens x (1 + alternatives), prompt "
            f"tokens included with echo), more than this server builds for one response "
            f"(--max-logprob-entries {limit}); lower n, max_tokens or the number of top logprobs",
            param=field, code="logprobs_limit_exceeded")


@dataclass(frozen=True)
class TextBound:
    """Characters past which a text can never fit the context: every token stands for at most
    bytes_per_token bytes of text (weights/token_bytes.py), and a character is at least one byte."""
    max_model_len: int
    bytes_per_token: int

    @property
    def max_chars(self) -> int:
        return self.max_model_len * self.bytes_per_token

    def check(self, text: str, param: str = "prompt") -> None:
        """Before tokenizing: len(text) costs nothing, the tokenizer's time grows with the text."""
        if len(text) > self.max_chars:
            raise InvalidRequestError(
                f"{param}: {len(text)} characters can never fit this model's context of {self.max_model_len} "
                f"tokens (max_model_len): no token stands for more than {self.bytes_per_token} bytes of text; "
                "shorten the prompt", param=param, code="context_length_exceeded")


def text_bound(max_model_len: int, bytes_per_token: int | None) -> TextBound | None:
    """None when the tokenizer gives no sound bound (then only the token count decides)."""
    return None if bytes_per_token is None else TextBound(max_model_len, bytes_per_token)
