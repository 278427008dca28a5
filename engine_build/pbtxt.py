"""A reader for protobuf text format (Triton's config.pbtxt) into plain Python values, with no schema.

`check-repo` must run where Triton's ModelConfig schema (tritonclient's generated code) is not importable, as in the
26.07 container; it reads the structure and checks it against the recorded contracts itself. Every field becomes a
list (protobuf's repeated and singular fields are written the same way in text format); a message is a dict.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    \s+ | \#[^\n]* |
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*') |
    (?P<punct>[{}\[\]:,;<>]) |
    (?P<word>[A-Za-z0-9_.+\-]+)
""", re.VERBOSE)
_CLOSING = {"{": "}", "<": ">"}


class PbtxtError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            line = text.count("\n", 0, position) + 1
            raise PbtxtError(f"line {line}: unexpected {text[position:position + 20]!r}")
        position = match.end()
        kind = match.lastgroup
        if kind is not None:
            tokens.append((kind, match.group(kind)))
    return tokens


def _scalar(kind: str, text: str):
    if kind == "string":
        return bytes(text[1:-1], "utf-8").decode("unicode_escape")
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text  # an enum value (TYPE_INT32, KIND_CPU)


class _Parser:
    def __init__(self, text: str):
        self.tokens = _tokens(text)
        self.position = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise PbtxtError("unexpected end of text")
        self.position += 1
        return token

    def message(self, closing: str | None) -> dict:
        fields: dict[str, list] = {}
        while True:
            token = self.peek()
            if token is None:
                if closing is not None:
                    raise PbtxtError(f"missing {closing!r}")
                return fields
            if token == ("punct", closing):
                self.take()
                return fields
            if token[1] in (",", ";"):
                self.take()
                continue
            kind, name = self.take()
            if kind != "word":
                raise PbtxtError(f"expected a field name, got {name!r}")
            if self.peek() == ("punct", ":"):
                self.take()
            fields.setdefault(name, []).extend(self.value())

    def value(self) -> list:
        kind, text = self.take()
        if kind == "punct" and text in _CLOSING:
            return [self.message(_CLOSING[text])]
        if kind == "punct" and text == "[":
            items = []
            while self.peek() != ("punct", "]"):
                if self.peek() == ("punct", ","):
                    self.take()
                    continue
                items.extend(self.value())
            self.take()
            return items
        if kind == "punct":
            raise PbtxtError(f"unexpected {text!r}")
        return [_scalar(kind, text)]


def parse_pbtxt(text: str) -> dict:
    return _Parser(text).message(None)


def first(message: dict, field: str, default=None):
    """The value of a singular field (its last occurrence, as protobuf reads it)."""
    values = message.get(field)
    return values[-1] if values else default


def parameters(config: dict) -> dict[str, str]:
    """`parameters { key: ... value: { string_value: ... } }` as a dict (Triton's map field)."""
    return {first(entry, "key"): first(first(entry, "value", {}), "string_value", "")
            for entry in config.get("parameters", [])}
