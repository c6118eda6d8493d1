"""How the bench turns chat messages into prompt token ids, for either kind of tokenizer."""
from __future__ import annotations

from collections.abc import Callable


def chat_encoder(tokenizer) -> Callable[[list[dict]], list[int]]:
    if hasattr(tokenizer, "encode_chat"):  # ridgeline.weights.tokenizer.Tokenizer
        return tokenizer.encode_chat
    # A transformers tokenizer: render, then encode without adding specials twice.
    return lambda msgs: tokenizer.encode(tokenizer.apply_chat_template(msgs, tokenize=False,
                                                                       add_generation_prompt=True),
                                         add_special_tokens=False)
