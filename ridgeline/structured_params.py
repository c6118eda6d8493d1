"""What a request's output must match (structured outputs), as plain frozen data validated once at
construction, like SamplingParams (which holds one as `structured`). Exactly one kind:

- json: a JSON schema (a dict, or its JSON text), stored as canonical JSON text;
- json_object: any JSON object (OpenAI's JSON mode);
- regex: a regular expression (Rust regex syntax: no lookaround, no backreferences);
- choice: one of these strings, exactly;
- grammar: a context-free grammar, Lark or GBNF (llama.cpp's) syntax;
- structural_tag: free text in which each trigger starts a tagged segment, `begin`, then JSON matching
  that structure's schema, then `end` (vLLM's {"structures": [...], "triggers": [...]}); stored as
  canonical JSON text.

Whether a backend can enforce it exactly (every keyword, every regex feature) is the backend's
check, at compile time (engine/constraint.py); here only the shape and the sizes."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from ridgeline.errors import InvalidRequestError
from ridgeline.inputs import check_text

# JSON as every backend writes it: no whitespace between tokens (llguidance's JSON options)
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":", "lenient": False}
MAX_STRUCTURED_BYTES = 256 * 1024  # schema, regex, grammar or all choices together, as UTF-8
MAX_CHOICES = 1024
KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")
PARAM = "structured_outputs"


def _bad(message: str, param: str = PARAM) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param)


def _size(text: str, what: str) -> None:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_STRUCTURED_BYTES:
        raise _bad(f"the {what} is over {MAX_STRUCTURED_BYTES // 1024} KiB")


def _as_mapping(value, what: str):
    """value, or the JSON object its text holds; a 400 naming `what` otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as e:
            raise _bad(f"{what} is not valid JSON ({str(e)[:80]})") from None
    if not isinstance(value, Mapping):
        raise _bad(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _schema(value) -> str:
    value = _as_mapping(value, "json: the schema")
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as e:
        raise _bad(f"json: the schema is not JSON data ({str(e)[:80]})") from None
    _size(text, "schema")
    return text


def _choices(value) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise _bad("choice: must be a list of strings")
    if not value:
        raise _bad("choice: must not be empty")
    if len(value) > MAX_CHOICES:
        raise _bad(f"choice: at most {MAX_CHOICES} strings, got {len(value)}")
    for c in value:
        if not isinstance(c, str) or not c:
            raise _bad(f"choice: every item must be a non-empty string, got {ascii(c)[:40]}")
    if len(set(value)) != len(value):
        dup = next(c for i, c in enumerate(value) if c in value[:i])
        raise _bad(f"choice: {ascii(dup)[:40]} is given twice")
    _size("".join(value), "choices")
    return tuple(value)


def _structural_tag(value) -> str:
    """vLLM's structural tag: {"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}, each
    begin starting with one of the triggers; a {"type": "structural_tag"} key is allowed (OpenAI-style)."""
    value = _as_mapping(value, "structural_tag: it")
    if "format" in value:
        raise _bad("structural_tag: the `format` form is not supported; give structures and triggers")
    extra = sorted(set(value) - {"type", "structures", "triggers"})
    if extra or value.get("type", "structural_tag") != "structural_tag":
        raise _bad(f"structural_tag: unknown key(s) {', '.join(extra) or 'type'}")
    triggers, structures = value.get("triggers"), value.get("structures")
    if not isinstance(triggers, list) or not triggers or not all(isinstance(t, str) and t for t in triggers):
        raise _bad("structural_tag: triggers must be a non-empty list of non-empty strings")
    if not isinstance(structures, list) or not structures:
        raise _bad("structural_tag: structures must be a non-empty list")
    out = []
    for i, st in enumerate(structures):
        where = f"structural_tag: structures[{i}]"
        if not isinstance(st, Mapping) or set(st) - {"begin", "schema", "end"} or "begin" not in st:
            raise _bad(f"{where}: must be an object with begin, schema and end")
        begin, end = st["begin"], st.get("end", "")
        if not isinstance(begin, str) or not isinstance(end, str):
            raise _bad(f"{where}: begin and end must be strings")
        if not any(begin.startswith(t) for t in triggers):
            raise _bad(f"{where}: begin {ascii(begin)[:40]} starts with none of the triggers")
        out.append({"begin": begin, "schema": json.loads(_schema(st.get("schema", {}))), "end": end})
    text = json.dumps({"structures": out, "triggers": triggers}, sort_keys=True, ensure_ascii=False,
                      separators=(",", ":"))
    _size(text, "structural tag")
    return text


def _text(value, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(f"{name}: must be a non-empty string")
    _size(value, name)
    return value


@dataclass(frozen=True)
class StructuredOutputs:
    json: Mapping | str | None = None  # stored as canonical JSON text
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None  # stored as a tuple
    grammar: str | None = None
    structural_tag: Mapping | str | None = None  # stored as canonical JSON text
    field: str = PARAM  # the request field it came from: errors about it name that field

    def _given(self) -> list[str]:
        return [k for k in KINDS if (self.json_object is True if k == "json_object" else getattr(self, k) is not None)]

    def __post_init__(self) -> None:
        if not isinstance(self.field, str):
            raise _bad("field: must be a string")
        try:
            self._validate()
        except InvalidRequestError as e:
            if self.field == PARAM:
                raise
            raise InvalidRequestError(self.field + e.message.removeprefix(PARAM), self.field, e.code) from None

    def _validate(self) -> None:
        given = self._given()
        if self.json_object is not True and self.json_object is not False:
            raise _bad("json_object: must be true or false")
        if len(given) != 1:
            raise _bad(f"give exactly one of {', '.join(KINDS)}, got "
                       f"{', '.join(given) if given else 'none'}")
        kind = given[0]
        check_text(getattr(self, kind), PARAM)
        if kind == "json":
            object.__setattr__(self, "json", _schema(self.json))
        elif kind == "choice":
            object.__setattr__(self, "choice", _choices(self.choice))
        elif kind == "structural_tag":
            object.__setattr__(self, "structural_tag", _structural_tag(self.structural_tag))
        elif kind in ("regex", "grammar"):
            _text(getattr(self, kind), kind)

    @property
    def kind(self) -> str:
        return self._given()[0]

    @cached_property
    def key(self) -> tuple[str, str]:
        """(kind, text): what a compiled constraint is cached by (with the tokenizer)."""
        kind = self.kind
        if kind == "json_object":
            return kind, ""
        if kind == "choice":
            return kind, json.dumps(list(self.choice), ensure_ascii=False)
        return kind, getattr(self, kind)
