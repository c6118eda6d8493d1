"""A request body -> its Route: token ids exactly as a replica computes them (a chat's messages
checked as the server checks them, inputs.chat_messages, and its template rendered by the same
Tokenizer code from the replicas' model folder; completions encoded as LLMEngine.encode_prompt
does), then the replicas' block hashes (in the request's prefix-cache namespace: its tenant's field
and `cache_salt`, engine/cache_namespace.py).

A body the router cannot read is routed without hashes (load only): the replica it reaches answers
the error, so the router never refuses a request a replica would accept."""
from __future__ import annotations

from pathlib import Path

from ridgeline.engine.cache_namespace import cache_namespace
from ridgeline.engine.prefix_cache import block_hashes
from ridgeline.inputs import chat_messages
from ridgeline.router.policy import Route

CHAT = "/v1/chat/completions"


class PromptHasher:
    def __init__(self, tokenizer_folder: str | Path, block_size: int):
        from ridgeline.weights.tokenizer import Tokenizer
        self.tokenizer = Tokenizer(Path(tokenizer_folder))
        self.block_size = block_size

    def token_ids(self, path: str, body: dict) -> list[int]:
        if path == CHAT:  # the messages as the server validates them, then its template input
            return self.tokenizer.encode_chat(chat_messages(body.get("messages")))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]  # several prompts: the first one decides
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt) if prompt else []
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return prompt
        return []

    def route(self, path: str, body, tenant: str | None = None) -> Route:
        """tenant: the request's tenant field (cache_namespace.tenant_salt), as its replica derives it."""
        try:
            ids = self.token_ids(path, body) if isinstance(body, dict) else []
        except Exception:  # invalid body: the replica will say why
            ids = []
        salt = body.get("cache_salt") if isinstance(body, dict) else None
        salt = salt if isinstance(salt, str) else None
        # a hit never covers the last token: only blocks before it can match
        hashes = block_hashes(ids[:-1], self.block_size, cache_namespace(tenant, None, salt)) if ids else []
        return Route(len(ids), hashes, self.block_size)
