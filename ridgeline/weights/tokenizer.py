"""Tokenizer + chat template for a HF-format folder (tokenizer.json, tokenizer_config.json)."""
from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from ridgeline.errors import InvalidRequestError, ModelLoadError
from ridgeline.weights import chat_template
from ridgeline.weights.chat_template import TemplateFailure
from ridgeline.weights.token_bytes import max_bytes_per_token

# render(template source, context) -> text, raising TemplateFailure: how a caller bounds rendering
Render = Callable[[str, dict], str]

ROLES = ("system", "user", "assistant", "tool", "developer")


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, folder: Path):
        path = folder / "tokenizer.json"
        if not path.exists():
            raise ModelLoadError(f"{path} is missing: Ridgeline needs a `tokenizers` tokenizer.json")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers library refuses a damaged file with a plain Exception
            raise ModelLoadError(f"{path} cannot be read as a tokenizer: {str(e)[:300]}") from None
        cfg_path = folder / "tokenizer_config.json"
        try:
            cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        except (ValueError, RecursionError) as e:
            raise ModelLoadError(f"{cfg_path} is not valid JSON: {e}") from None
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{cfg_path} is not a JSON object")
        self.chat_template: str | None = cfg.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default") or next(iter(named.values()))
        jinja_path = folder / "chat_template.jinja"
        if self.chat_template is None and jinja_path.exists():
            self.chat_template = jinja_path.read_text()
        self.bos_token = _token_text(cfg.get("bos_token"))
        self.eos_token = _token_text(cfg.get("eos_token"))
        self.add_bos = bool(cfg.get("add_bos_token", False))
        self.bos_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.special_ids = {t_id for t_id, t in self._tok.get_added_tokens_decoder().items() if t.special}
        self.added_ids = set(self._tok.get_added_tokens_decoder())  # special or not
        specials = [t for t in self._tok.get_added_tokens_decoder().values() if t.special]
        # finds special-token text typed inside message content (longest first)
        self._special_re = re.compile("|".join(re.escape(t.content) for t in sorted(
            specials, key=lambda t: -len(t.content)))) if specials else None
        self._plain = None  # a copy that reads special-token text as plain text (see encode_chat)
        self._template = None

    @cached_property
    def max_bytes_per_token(self) -> int | None:
        """The most bytes of input text one token stands for (None: no sound bound; token_bytes.py)."""
        return max_bytes_per_token(self._tok)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch, not encode: it releases the GIL, so a long text does not stall the server's event loop
        ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if add_special_tokens and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id] + ids
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)] if not self.add_bos else [self.encode(t) for t in texts]

    def to_json(self) -> str:
        """The `tokenizers` tokenizer as its tokenizer.json text (for a grammar backend's token table)."""
        return self._tok.to_str()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            render: Render | None = None, **extra) -> str:
        """Render messages with the model's template; any failure is an InvalidRequestError naming
        it. render: renders instead of this process (the server's bounded worker, template_worker.py)."""
        if not messages:
            raise InvalidRequestError("messages must be a non-empty list", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                raise InvalidRequestError(f"messages[{i}].role must be one of {ROLES}", "messages")
        if self.chat_template is None:
            return "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages) + (
                "assistant: " if add_generation_prompt else "")
        context = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token or "", "eos_token": self.eos_token or "", **extra}
        try:
            if render is not None:
                return render(self.chat_template, context)
            if self._template is None:
                self._template = chat_template.compile_template(self.chat_template)
            return chat_template.render(self._template, context)
        except TemplateFailure as e:
            raise InvalidRequestError(str(e), "messages") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    rendered: str | None = None, render: Render | None = None, **extra) -> list[int]:
        """Token ids of the rendered conversation (rendered: apply_chat_template's result, if the
        caller has it). Message contents are plain text: special-token text typed in one (e.g.
        "<|im_start|>system") stays text and cannot forge a role or a turn; the template's own
        special tokens are parsed. Conversations without such text encode exactly as the rendered
        string does. render, extra (template variables such as tools): as for apply_chat_template."""
        if rendered is None:
            rendered = self.apply_chat_template(messages, add_generation_prompt, render, **extra)
        if not any(self._has_special_text(m.get("content")) for m in messages):
            return self.encode(rendered, add_special_tokens=False)
        return self._encode_segments(messages, add_generation_prompt, rendered, render, extra)

    def special_text_in(self, value) -> bool:
        """Whether special-token text appears in any string inside value (nested lists and dicts,
        keys included): for what a template renders outside message contents (tools, call arguments)."""
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, (list, tuple)):
                stack.extend(v)
            elif self._has_special_text(v):
                return True
        return False

    def token_id(self, text: str) -> int | None:
        """The id of the added (or special) token whose text is exactly this, or None."""
        i = self._tok.token_to_id(text)
        return i if i in self.added_ids else None

    def _has_special_text(self, content) -> bool:
        if not isinstance(content, str) or self._special_re is None:
            return False
        normalizer = self._tok.normalizer  # added tokens marked `normalized` match the normalized text
        return bool(self._special_re.search(content)
                    or (normalizer is not None and self._special_re.search(normalizer.normalize_str(content))))

    def _encode_segments(self, messages: list[dict], add_generation_prompt: bool, rendered: str,
                         render: Render | None, extra: dict) -> list[int]:
        """Render with a unique placeholder per content, then encode the template's text with special
        tokens parsed and each content with them read as text."""
        nonce = secrets.token_hex(8)
        marks = [m if not isinstance(m.get("content"), str) else {**m, "content": f"\ue000{nonce}:{i}\ue001"}
                 for i, m in enumerate(messages)]
        pieces = re.split(f"\ue000{nonce}:(\\d+)\ue001", self.apply_chat_template(marks, add_generation_prompt, render,
                                                                                   **extra))
        contents = [m.get("content") for m in messages]

        def joined(cs: list) -> str:
            return "".join(p if j % 2 == 0 else cs[int(p)] for j, p in enumerate(pieces))

        stripped = [c.strip() if isinstance(c, str) else c for c in contents]
        if joined(contents) != rendered and joined(stripped) == rendered:  # a template that trims contents
            contents = stripped
        if self._plain is None:
            plain = HFTokenizer.from_str(self._tok.to_str())
            plain.encode_special_tokens = True  # a separate copy: the switch is per tokenizer, not per call
            self._plain = plain
        ids: list[int] = []
        for j, piece in enumerate(pieces):
            if j % 2 == 0:
                ids += self._tok.encode(piece, add_special_tokens=False).ids if piece else []
            else:
                ids += self._plain.encode(contents[int(piece)], add_special_tokens=False).ids
        return ids
