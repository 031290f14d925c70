"""A standard-library stand-in for the two things ``smolfsdp.traces.load`` asks of ijson.

Why it exists: the lent GPU machine's Python image has no ijson (and nothing can be installed
there), yet the GPU check reads its profiler traces on that machine. ``load`` uses ijson (its C
backend parses faster) when it is installed and this module otherwise. Same contract: the
top-level keys before ``traceEvents`` and then the events one at a time, memory bounded by one
chunk of text plus one event, never the whole file. ``json.JSONDecoder.raw_decode`` parses each
value; the scanner here only walks the top-level object and the event list between them.

    from smolfsdp.traces.json_stream import read_header, iter_events
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import Any, BinaryIO

CHUNK = 1 << 20  # decompressed bytes read at a time
_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


class StreamError(ValueError):
    """Invalid or truncated JSON; a truncated file's message holds "premature EOF" (as ijson's does)."""


class _Scanner:
    """Text of a binary stream, read ``CHUNK`` at a time; ``i`` is the position of the next character."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.text, self.i, self.eof = stream, "", 0, False
        self.utf8 = codecs.getincrementaldecoder("utf-8")()

    def _fill(self) -> bool:
        if self.eof:
            return False
        data = self.stream.read(CHUNK)
        self.eof = not data
        self.text = self.text[self.i :] + self.utf8.decode(data, final=self.eof)
        self.i = 0
        return not self.eof or bool(self.text)

    def peek(self) -> str:
        """The next non-blank character ("" at the end of the file), not consumed."""
        while True:
            n = len(self.text)
            while self.i < n and self.text[self.i] in _WS:
                self.i += 1
            if self.i < n:
                return self.text[self.i]
            if not self._fill() or self.eof and self.i >= len(self.text):
                return ""

    def expect(self, chars: str, where: str) -> str:
        c = self.peek()
        if c == "":
            raise StreamError(f"premature EOF: the file ends {where}")
        if c not in chars:
            raise StreamError(f"expected one of {chars!r} {where}, found {c!r}")
        self.i += 1
        return c

    def value(self) -> Any:
        """The next complete JSON value; reads more text until it is whole (a number may go on)."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.text, self.i)
            except json.JSONDecodeError as err:
                if self.eof:
                    cut = err.pos >= len(self.text.rstrip()) or err.msg.startswith("Unterminated string")
                    raise StreamError(f"premature EOF: {err}" if cut else f"invalid JSON: {err}") from err
                self._fill()
                continue
            if end == len(self.text) and not self.eof and self._fill():
                continue  # "12" at the end of the text may be the start of "1234"
            self.i = end
            return obj


def _kind(value: Any) -> str:
    """A JSON value's type in JSON's words (as ijson's events name them)."""
    if isinstance(value, bool) or value is None:
        return "boolean" if value is not None else "null"
    names = {dict: "map", list: "array", str: "string", int: "number", float: "number"}
    return names[type(value)]


def read_header(stream: BinaryIO) -> tuple[dict[str, Any], str | None, _Scanner]:
    """(header, prefix, scanner): the top-level keys before ``traceEvents`` and where events are.

    ``prefix`` as ijson names it: ``"item"`` for a bare list of events, ``"traceEvents.item"`` for
    an object holding one, None for an object without it (header then holds every key). The
    scanner stands just inside the list. Raises StreamError for anything else at the top.
    """
    sc = _Scanner(stream)
    top = sc.peek()
    if top == "[":
        sc.i += 1
        return {}, "item", sc
    if top != "{":
        value = sc.value()
        raise StreamError(
            f"JSON {_kind(value)} {value!r} at the top, not a trace: expected an object "
            "with a traceEvents list (PyTorch profiler) or a list of events"
        )
    sc.i += 1
    header: dict[str, Any] = {}
    if sc.peek() == "}":
        return header, None, sc
    while True:
        key = sc.value()
        sc.expect(":", f"after the key {key!r}")
        if key == "traceEvents":
            if sc.peek() != "[":
                raise StreamError(f"traceEvents is a {_kind(sc.value())}, expected a list of events")
            sc.i += 1
            return header, "traceEvents.item", sc
        header[key] = sc.value()
        if sc.expect(",}", "between the top-level keys") == "}":
            return header, None, sc


def iter_events(sc: _Scanner) -> Iterator[Any]:
    """The items of the list the scanner stands in, one at a time."""
    if sc.peek() == "]":
        return
    while True:
        yield sc.value()
        if sc.expect(",]", "inside the list of events") == "]":
            return
