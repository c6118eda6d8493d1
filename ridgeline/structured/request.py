"""The request fields that ask for structured outputs, in OpenAI's and vLLM's spellings, to one
StructuredOutputs (or None):

- OpenAI `response_format`: {"type": "text"} (nothing), {"type": "json_object"}, or
  {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": true | false}}
  (enforced either way: `strict: false` is no licence to stray);
- OpenAI-style {"type": "structural_tag", "structures": [...], "triggers": [...]} (vLLM's);
- vLLM `structured_outputs`: {"json": schema} | {"regex": ...} | {"choice": [...]} | {"grammar": ...}
  | {"json_object": true} | {"structural_tag": ...} (an object or its JSON text);
- vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, `structural_tag` (with
  `guided_decoding_backend` null, "auto", "guidance" or "llguidance");
- SGLang's `regex`, `ebnf` and `json_schema` (JSON text), llama.cpp's `grammar` (GBNF) and `json_schema`
  (an object).

More than one of these in one request is a 400, as is anything that cannot be enforced. Errors name
the field the client used."""
from __future__ import annotations

from typing import Any

from ridgeline.errors import InvalidRequestError
from ridgeline.structured_params import StructuredOutputs

# one-kind fields at the top of a request -> the kind: vLLM's older spellings, SGLang's (`regex`, `ebnf`,
# `json_schema` as JSON text) and llama.cpp's (`grammar` in GBNF, `json_schema` as an object)
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
          "regex": "regex", "ebnf": "grammar", "json_schema": "json", "grammar": "grammar",
          "structural_tag": "structural_tag"}
BACKENDS = (None, "auto", "guidance", "llguidance")
# structured_outputs keys vLLM has and Ridgeline does not honour (its others are the kinds)
_REFUSED_KEYS = {"whitespace_pattern": "a whitespace pattern",
                 "disable_any_whitespace": "whitespace options (JSON is always compact here)",
                 "disable_additional_properties": "rewriting additionalProperties",
                 "disable_fallback": "backend fallback options", "backend": "backend choice"}
_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _bad(field: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{field}: {message}", param=field)


def _build(field: str, **kw) -> StructuredOutputs:
    return StructuredOutputs(**kw, field=field)


def _response_format(rf: dict) -> StructuredOutputs | None:
    kind = rf.get("type")
    if kind == "structural_tag":
        return _build("response_format", structural_tag=dict(rf))
    extra = sorted(set(rf) - {"type", "json_schema"})
    if extra:
        raise _bad("response_format", f"unknown key(s) {', '.join(extra)}")
    if kind == "text":
        return None
    if kind == "json_object":
        return _build("response_format", json_object=True)
    if kind != "json_schema":
        raise _bad("response_format", f"type must be text, json_object, json_schema or structural_tag, got "
                                      f"{ascii(kind)[:40]}")
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _bad("response_format", "json_schema: must be an object with name and schema")
    extra = sorted(set(js) - {"name", "description", "schema", "strict"})
    if extra:
        raise _bad("response_format", f"json_schema: unknown key(s) {', '.join(extra)}")
    if "schema" not in js or js["schema"] is None:
        raise _bad("response_format", "json_schema: schema is missing")
    if js.get("strict") not in (None, True, False):
        raise _bad("response_format", "json_schema.strict: must be true or false")
    return _build("response_format", json=js["schema"])


def _structured_outputs(so: dict) -> StructuredOutputs:
    for key, what in _REFUSED_KEYS.items():
        if so.get(key) not in (None, False) and not (key == "backend" and so[key] in BACKENDS):
            raise InvalidRequestError(f"structured_outputs.{key}: {what} is not supported yet", param="structured_outputs",
                                      code="unsupported_parameter")
    unknown = sorted(set(so) - set(_KINDS) - set(_REFUSED_KEYS))
    if unknown:
        raise _bad("structured_outputs", f"unknown key(s) {', '.join(unknown)}")
    kinds = {k: so[k] for k in _KINDS if so.get(k) not in (None, False)}
    return _build("structured_outputs", **kinds)


def from_request(response_format: dict | None, structured_outputs: dict | None,
                 guided: dict[str, Any], backend: str | None) -> tuple[StructuredOutputs | None, str | None]:
    """(spec, the field that asked for it); (None, None) when nothing did."""
    asked = [name for name, v in (("response_format", response_format if response_format != {"type": "text"}
                                   else None), ("structured_outputs", structured_outputs), *guided.items())
             if v is not None]
    if backend not in BACKENDS:
        raise InvalidRequestError(f"guided_decoding_backend: only llguidance is built in, got {ascii(backend)[:40]}",
                                  param="guided_decoding_backend", code="unsupported_parameter")
    if len(asked) > 1:
        raise _bad(asked[1], f"give one way of constraining the output, not {' and '.join(asked)}")
    if not asked:
        return None, None
    field = asked[0]
    if field == "response_format":
        return _response_format(response_format), field
    if field == "structured_outputs":
        return _structured_outputs(structured_outputs), field
    return _build(field, **{GUIDED[field]: guided[field]}), field
