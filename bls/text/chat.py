"""Chat conversations as clients send them: OpenAI-style JSON messages, validated before any template sees them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bls.batch import decode_json
from bls.errors import InvalidRequest

# Llama 3 names the role that carries tool results "ipython" (3.1's template also accepts "tool" and
# renders it as "ipython"; the Llama 3 template renders role names verbatim, so only the name the model
# was trained on is accepted).
CHAT_ROLES = ("system", "user", "assistant", "ipython")

@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


def parse_chat_messages(text: str, field: str) -> list[ChatMessage]:
    """A JSON chat (`[{"role": ..., "content": ...}, ...]`) as validated messages. A chat nests two levels (a list
    of objects); deeper JSON is refused before it is decoded (bls.batch.decode_json)."""
    return validate_chat_messages(decode_json(text, field), field)


def validate_chat_messages(value: Any, field: str) -> list[ChatMessage]:
    """Messages from decoded JSON (or ChatMessage objects); anything the template could misread is refused."""
    if not isinstance(value, list):
        raise InvalidRequest(field, 'must be a JSON list of {"role": ..., "content": ...} objects')
    if not value:
        raise InvalidRequest(field, "has no messages")
    messages = []
    for index, item in enumerate(value):
        if isinstance(item, ChatMessage):
            item = {"role": item.role, "content": item.content}
        if not isinstance(item, dict):
            raise InvalidRequest(field, f"message {index} is not an object")
        # Other keys (name, tool_calls...) would be dropped silently by the Llama 3 template.
        unknown = sorted(set(item) - {"role", "content"})
        if unknown:
            raise InvalidRequest(field, f"message {index} has unsupported keys {unknown}; only role and content")
        role, content = item.get("role"), item.get("content")
        if role not in CHAT_ROLES:
            hint = " (tool results use 'ipython')" if role == "tool" else ""
            raise InvalidRequest(field, f"message {index} has role {role!r}; expected one of {list(CHAT_ROLES)}{hint}")
        if not isinstance(content, str):
            raise InvalidRequest(field, f"message {index} content must be a string")
        messages.append(ChatMessage(role, content))
    return messages
