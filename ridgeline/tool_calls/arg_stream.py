"""Calls read as they are written, for streaming their arguments in pieces: a block's body of JSON calls
(`{"name": "...", "arguments": {...}}`, one after another or in a list) is scanned as it grows; once a
call's head (its name, then its arguments key) is in, the call opens, and the arguments object's text
goes out as it arrives, the exact characters the model wrote, until its braces balance.

Used only where a grammar writes the calls (tool_choice required, named, or auto with a lazy grammar),
so a call that opened is a call: it is never taken back as content. A reply cut mid-call (max_tokens)
keeps its call with the arguments written so far. Whatever the chunking, the same text gives the same
calls and the same concatenated arguments: the scanner only moves forward over text that is final."""
from __future__ import annotations

import json
import re

# a call's head, from where the previous call (or the block) ended: separators, a list's bracket, the
# object's opening, its name, then the arguments key; the arguments object's "{" is the last character
_HEAD = re.compile(r'[\s\[,;]*\{\s*"name"\s*:\s*("(?:[^"\\\n]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*\{')
_SEEK, _ARGS, _CLOSE = 0, 1, 2  # looking for a head; inside the arguments object; before the call's "}"


class ArgStream:
    """One block's scanner. advance() and finish() return steps, in order: ("open", name),
    ("piece", text) and ("close", arguments): the whole arguments text, the concatenated pieces."""

    def __init__(self):
        self.pos = 0  # body text consumed: everything before it belongs to a call already opened
        self.opened = 0  # calls opened in this block
        self._state = _SEEK
        self._args = ""  # the open call's arguments so far
        self._depth, self._in_string, self._escape = 0, False, False

    def advance(self, body: str) -> list[tuple[str, str]]:
        """body: the block's text so far (final: the caller holds back what could still become its end)."""
        steps: list[tuple[str, str]] = []
        while self.pos < len(body):
            if self._state == _SEEK:
                m = _HEAD.match(body, self.pos)
                if m is None:
                    break  # not (yet) a head: wait for more, or the block's close reads the rest whole
                try:
                    name = json.loads(m.group(1))
                except ValueError:
                    break
                self.pos, self._state = m.end() - 1, _ARGS
                self._depth, self._in_string, self._escape, self._args = 0, False, False, ""
                self.opened += 1
                steps.append(("open", name))
            elif self._state == _ARGS:
                start, end = self.pos, self._scan(body)
                piece = body[start:end]
                self._args += piece
                self.pos = end
                if piece:
                    steps.append(("piece", piece))
                if self._depth == 0:
                    self._state = _CLOSE
                    steps.append(("close", self._args))
            else:  # after the arguments: the call object's closing brace, if it is there
                while self.pos < len(body) and body[self.pos] in " \t\r\n":
                    self.pos += 1
                if self.pos < len(body):
                    if body[self.pos] == "}":
                        self.pos += 1
                    self._state = _SEEK
        return steps

    def _scan(self, body: str) -> int:
        """Move over the arguments object's characters; returns where it stopped (after its last brace,
        or the end of body)."""
        i = self.pos
        while i < len(body):
            c = body[i]
            i += 1
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i
        return i

    def finish(self) -> list[tuple[str, str]]:
        """The block closed (or the reply ended): a call cut inside its arguments keeps what it has."""
        if self._state != _ARGS:
            return []
        self._state = _SEEK
        return [("close", self._args)]
