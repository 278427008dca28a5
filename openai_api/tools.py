"""Tool calls in Llama 3.1's JSON format: the grammar that forces one (tool_choice required / named) and the parser
that finds one in what the model wrote (tool_choice auto).

The model is prompted (bls.text.chat.LLAMA31_TOOL_CHAT_TEMPLATE) to answer a call as
`{"name": function name, "parameters": {...}}`, after `<|python_tag|>` in some outputs; Meta's
`ChatFormat.decode_assistant_message_from_content` (llama-models 0.3.0) and vLLM's `llama3_json` parser also take
`"arguments"` for the parameters and several calls separated by "; ".
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text, as OpenAI's `function.arguments`


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def forced_call_schema(tools: list[dict], name: str | None) -> dict:
    """The JSON schema of one call of the named tool, or of any tool (required): the name is a constant and the
    parameters are the tool's own schema, so the call validates against it whatever the model samples."""
    def call_of(tool: dict) -> dict:
        function = tool["function"]
        return {"type": "object",
                "properties": {"name": {"const": function["name"]},
                               "parameters": function.get("parameters") or {"type": "object"}},
                "required": ["name", "parameters"], "additionalProperties": False}

    chosen = [tool for tool in tools if name is None or tool["function"]["name"] == name]
    return call_of(chosen[0]) if len(chosen) == 1 else {"anyOf": [call_of(tool) for tool in chosen]}


def may_be_call(text: str) -> bool:
    """Whether text the model has started could still become a call (auto: such text is held until the end)."""
    head = text.lstrip()
    return not head or head.startswith("{") or PYTHON_TAG.startswith(head[:len(PYTHON_TAG)]) \
        or head.startswith(PYTHON_TAG)


def parse_calls(text: str, tool_names: set[str]) -> list[ParsedCall] | None:
    """The calls in a whole output, or None when it is not (only) calls of defined tools: then it is text."""
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    if not body.startswith("{"):
        return None
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    position = 0
    while position < len(body):
        try:
            value, position = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return None
        if not isinstance(value, dict) or value.get("name") not in tool_names:
            return None
        arguments = value.get("parameters", value.get("arguments", {}))
        if not isinstance(arguments, dict) or set(value) - {"name", "parameters", "arguments", "type"}:
            return None
        calls.append(ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False)))
        rest = body[position:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            return None
        position = len(body) - len(rest)
    return calls or None


# The head of a forced call as the grammar writes it (the schema's properties in its order, name then parameters),
# complete once the parameters' first character has come.
_FORCED_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"parameters"\s*:\s*(?=\S)')


class ForcedCallStream:
    """A forced call (tool_choice required / named) as it is generated: its name once the head
    `{"name": "...", "parameters": ` is complete, then the parameters' JSON text as it grows.

    The text after the head is the parameters' value and then the call's closing brace; what is passed on is the text
    up to its last non-blank character, without a last "}" (which may be the call's own): so what went out is always
    a beginning of the parameters' text, and the rest goes out at the end (`finish`).
    """

    def __init__(self) -> None:
        self.text = ""
        self.name: str | None = None
        self._head_end = 0
        self._sent = 0

    def push(self, delta: str) -> tuple[str | None, str]:
        """(the call's name when it has just become known, else None; new argument text)."""
        self.text += delta
        named = None
        if self.name is None:
            match = _FORCED_HEAD.match(self.text)
            if match is None:
                return None, ""
            self.name = named = json.loads(match.group(1))
            self._head_end = match.end()
        arguments = self.text[self._head_end:].rstrip()
        if arguments.endswith("}"):
            arguments = arguments[:-1].rstrip()
        return named, self._new(arguments)

    def finish(self) -> str:
        """The argument text not passed on yet, at the end of the generation: without the call's closing brace when
        the call is complete; cut short (max_tokens), all that was generated."""
        if self.name is None:
            return ""
        arguments = self.text[self._head_end:].rstrip()
        try:
            json.loads(self.text)
        except json.JSONDecodeError:
            return self._new(arguments)
        return self._new(arguments[:-1].rstrip())

    def _new(self, arguments: str) -> str:
        if len(arguments) <= self._sent:
            return ""
        new, self._sent = arguments[self._sent:], len(arguments)
        return new
