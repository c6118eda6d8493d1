"""Chat templates (HF's jinja2 dialect) compiled and rendered in jinja2's immutable sandbox, with
the globals and filters HF templates use. One home for the environment: the tokenizer renders
here in-process, and the server's bounded worker (template_worker.py) runs the same code in a
child process. Every failure, of the template or of what it does with the messages, is a
TemplateFailure carrying a message fit for the client."""
from __future__ import annotations

import json
from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateFailure(Exception):
    """The template did not compile, raised, failed on the messages, or went over a limit."""


def _raise(message: str):
    raise TemplateError(message)


def _tojson(value, indent=None, **_):
    return json.dumps(value, indent=indent, ensure_ascii=False)


def compile_template(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except Exception as e:  # a syntax error: the model's template, not the request, is at fault
        raise TemplateFailure(f"the model's chat template does not compile: {_why(e)}") from None


def render(template, context: dict, max_bytes: int | None = None) -> str:
    """template: compile_template's result; context: the template's variables (messages,
    add_generation_prompt, bos_token, ...). max_bytes: stop as soon as the output passes it
    (counted as it is produced, not after)."""
    pieces, size = [], 0
    try:
        for piece in template.generate(**context):
            pieces.append(piece)
            if max_bytes is not None:
                size += len(piece.encode("utf-8", "surrogatepass"))
                if size > max_bytes:
                    raise TemplateFailure(f"the chat template produced more than {max_bytes} bytes for these "
                                          "messages (--chat-template-max-bytes)")
        return "".join(pieces)
    except TemplateFailure:
        raise
    except MemoryError:
        raise TemplateFailure("the chat template ran out of memory on these messages") from None
    except TemplateError as e:  # raise_exception() and jinja's own errors: the template's message
        raise TemplateFailure(f"the chat template rejected these messages: {_why(e)}") from None
    except Exception as e:  # what a template does to the messages: 1 + "a", a missing key, deep recursion
        raise TemplateFailure(f"the chat template failed on these messages: {type(e).__name__}: {_why(e)}") from None


def _why(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 1000 else text[:997] + "..."
