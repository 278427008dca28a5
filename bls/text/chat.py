"""Chat conversations as clients send them: OpenAI-style JSON messages (and tools), validated before any template
sees them.

The `messages` input is either a JSON list of messages, or an object `{"messages": [...], "tools": [...]}` for a
conversation with tool definitions. Besides `role` and `content`, an assistant message may carry `tool_calls`
(OpenAI's shape: `[{"id", "type": "function", "function": {"name", "arguments"}}]`, arguments a JSON object or its
JSON text) and a `tool` message a `tool_call_id` (Llama 3 has no call ids, so the template does not render it).
Tool definitions, call names, arguments and results are user data like any content: the tokenizer keeps every
special-token string inside them as text (bls.text.tokenizer.TokenizerBundle.encode_chat).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bls.batch import decode_json
from bls.errors import InvalidRequest

# The roles the Llama 3 templates know. "ipython" carries tool results in Llama 3's own templates (which render
# role names verbatim); "tool" is OpenAI's name for it, rendered as "ipython" by the tool-calling template
# (LLAMA31_TOOL_CHAT_TEMPLATE), so a conversation with a "tool" message is always rendered by one.
CHAT_ROLES = ("system", "user", "assistant", "ipython", "tool")
_MESSAGE_KEYS = {"role", "content", "tool_calls", "tool_call_id"}
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}

# The chat template of meta-llama/Llama-3.1-8B-Instruct's tokenizer_config.json (the same in 3.1 70B/405B and 3.3
# 70B Instruct), verbatim: custom tools as JSON in the first user message ("Environment: ipython" in the system
# turn), an assistant's single tool call as {"name", "parameters"}, results in "ipython" turns. Used for a
# conversation with tools when the model's own template has no tool support (Llama 3.0's does not); a model whose
# template takes `tools` renders its own. Checked against the official rendering by tests/unit/test_openai_tools.py.
LLAMA31_TOOL_CHAT_TEMPLATE = (
    "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n"
    "{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n"
    "{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n"
    "{#- This block extracts the system message, so we can slot it into the right place. #}\n"
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n\n"
    "{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if builtin_tools is defined or tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n"
    "{%- if builtin_tools is defined %}\n"
    "    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") + \"\\n\\n\"}}\n"
    "{%- endif %}\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with JSON for a "
    "function call.\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n\n"
    "{#- Custom tools are passed in a user message with some extra guidance #}\n"
    "{%- if tools_in_user_message and not tools is none %}\n"
    "    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n"
    "        {%- set first_user_message = messages[0]['content']|trim %}\n        {%- set messages = messages[1:] %}\n"
    "    {%- else %}\n        {{- raise_exception(\"Cannot put tools in the first user message when there's no "
    "first user message!\") }}\n{%- endif %}\n"
    "    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n"
    "    {{- \"Given the following functions, please respond with a JSON for a function call \" }}\n"
    "    {{- \"with its proper arguments that best answers the given prompt.\\n\\n\" }}\n"
    "    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its "
    "value}.' }}\n"
    "    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n    {%- endfor %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n"
    "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
    "        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n"
    "            {%- for arg_name, arg_val in tool_call.arguments | items %}\n"
    "                {{- arg_name + '=\"' + arg_val + '\"' }}\n                {%- if not loop.last %}\n"
    "                    {{- \", \" }}\n                {%- endif %}\n                {%- endfor %}\n"
    "            {{- \")\" }}\n        {%- else  %}\n"
    "            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "            {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n            {{- '\"parameters\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n            {{- \"}\" }}\n        {%- endif %}\n"
    "        {%- if builtin_tools is defined %}\n            {#- This means we're in ipython mode #}\n"
    "            {{- \"<|eom_id|>\" }}\n        {%- else %}\n            {{- \"<|eot_id|>\" }}\n        {%- endif %}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n"
    "        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n"
)


@dataclass(frozen=True)
class ToolCall:
    """An assistant's call in the history: the function's name and its arguments (a decoded JSON object)."""

    name: str
    arguments: dict
    id: str | None = None

    def template_dict(self) -> dict:
        call = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if self.id is None else {"id": self.id, **call}


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def template_dict(self) -> dict:
        """The message as chat templates read it (the `tool_calls` key only where there are calls: templates test
        for the key)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


@dataclass(frozen=True)
class Chat:
    """A validated conversation: its messages and, where the client sent them, its tool definitions (OpenAI's
    `{"type": "function", "function": {...}}` objects, passed to the template as they came)."""

    messages: tuple[ChatMessage, ...]
    tools: tuple[dict, ...] | None = None

    @property
    def uses_tools(self) -> bool:
        """Tools defined, or tool calls / `tool` results in the history: only a tool-calling template renders it."""
        return self.tools is not None or any(m.role == "tool" or m.tool_calls for m in self.messages)

    def data_texts(self) -> Iterator[str]:
        """Every client text the rendering will hold (for size limits before tokenizing)."""
        for message in self.messages:
            yield message.content
            for call in message.tool_calls:
                yield call.name
                yield json.dumps(call.arguments, ensure_ascii=False)
        for tool in self.tools or ():
            yield json.dumps(tool, ensure_ascii=False)


def parse_chat(text: str, field: str) -> Chat:
    """A JSON chat (a list of messages, or {"messages": [...], "tools": [...]}) as a validated Chat. Deeper JSON than
    bls.batch allows is refused before it is decoded (tool schemas nest; the limit is the same everywhere)."""
    return validate_chat(decode_json(text, field), field)


def validate_chat(value: Any, field: str) -> Chat:
    """A Chat from decoded JSON, a list of ChatMessage objects, or a Chat; anything a template could misread or
    drop is refused naming what is wrong."""
    if isinstance(value, Chat):
        return value
    tools = None
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"messages", "tools"})
        if unknown or "messages" not in value:
            raise InvalidRequest(field, 'must be a JSON list of {"role": ..., "content": ...} objects, or an object '
                                        '{"messages": [...], "tools": [...]}'
                                        f'{f"; unknown keys {unknown}" if unknown else ""}')
        tools = _validate_tools(value.get("tools"), field)
        value = value["messages"]
    if not isinstance(value, list):
        raise InvalidRequest(field, 'must be a JSON list of {"role": ..., "content": ...} objects')
    if not value:
        raise InvalidRequest(field, "has no messages")
    return Chat(tuple(_validate_message(item, index, field) for index, item in enumerate(value)), tools)


def _validate_message(item: Any, index: int, field: str) -> ChatMessage:
    if isinstance(item, ChatMessage):
        return item
    if not isinstance(item, dict):
        raise InvalidRequest(field, f"message {index} is not an object")
    # Other keys (name...) would be dropped silently by the Llama 3 templates.
    unknown = sorted(set(item) - _MESSAGE_KEYS)
    if unknown:
        raise InvalidRequest(field, f"message {index} has unsupported keys {unknown}; only {sorted(_MESSAGE_KEYS)}")
    role, content = item.get("role"), item.get("content")
    if role not in CHAT_ROLES:
        raise InvalidRequest(field, f"message {index} has role {role!r}; expected one of {list(CHAT_ROLES)}")
    calls = item.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            raise InvalidRequest(field, f"message {index}: only assistant messages have tool_calls")
        if content not in (None, ""):
            # Llama 3.1's format has no text beside a call: the template would drop it.
            raise InvalidRequest(field, f"message {index}: an assistant message with tool_calls has no content in "
                                        "Llama 3's format (send the text as a message of its own)")
        content = ""
        if not isinstance(calls, list) or not calls:
            raise InvalidRequest(field, f"message {index}: tool_calls must be a non-empty list")
        calls = tuple(_validate_tool_call(call, index, field) for call in calls)
    if "tool_call_id" in item and (role != "tool" or not isinstance(item["tool_call_id"], str)):
        raise InvalidRequest(field, f"message {index}: tool_call_id is a string, on tool messages only")
    if not isinstance(content, str):
        raise InvalidRequest(field, f"message {index} content must be a string")
    return ChatMessage(role, content, calls or (), item.get("tool_call_id"))


def _validate_tool_call(call: Any, index: int, field: str) -> ToolCall:
    where = f"message {index}: tool_calls"
    if (not isinstance(call, dict) or set(call) - {"id", "type", "function"}
            or call.get("type", "function") != "function"):
        raise InvalidRequest(field,
                             f'{where}: each is {{"id", "type": "function", "function": {{"name", "arguments"}}}}')
    function = call.get("function")
    if (not isinstance(function, dict) or set(function) - {"name", "arguments"}
            or not isinstance(function.get("name"), str)):
        raise InvalidRequest(field, f'{where}: function must be {{"name": string, "arguments": JSON object}}')
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise InvalidRequest(
                field, f"{where}: arguments of {function['name']!r} are not valid JSON ({error})"
            ) from None
    if not isinstance(arguments, dict):
        raise InvalidRequest(field, f"{where}: arguments of {function['name']!r} must be a JSON object")
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise InvalidRequest(field, f"{where}: id must be a string")
    return ToolCall(function["name"], arguments, call_id)


def _validate_tools(tools: Any, field: str) -> tuple[dict, ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not tools:
        raise InvalidRequest(field, "tools must be a non-empty list of function tools")
    names = set()
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or set(tool) - _TOOL_KEYS or tool.get("type") != "function":
            raise InvalidRequest(field, f'tool {index} must be {{"type": "function", "function": {{...}}}}')
        function = tool.get("function")
        if not isinstance(function, dict) or set(function) - _FUNCTION_KEYS:
            raise InvalidRequest(field, f"tool {index}: function may have only {sorted(_FUNCTION_KEYS)}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(field, f"tool {index}: function.name must be a non-empty string")
        if name in names:
            raise InvalidRequest(field, f"tool {index}: function name {name!r} is defined twice")
        names.add(name)
        if not isinstance(function.get("description", ""), str):
            raise InvalidRequest(field, f"tool {index}: function.description must be a string")
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidRequest(field, f"tool {index}: function.parameters must be a JSON schema object")
    return tuple(tools)
