"""The wire shapes of the API, as pydantic models: the requests this server takes (OpenAI's request bodies,
openai-python's `chat/completion_create_params.py`, `completion_create_params.py`) and the responses it sends
(`ChatCompletion`, `Completion`, `Model`, the error object), which /openapi.json declares.

Every field OpenAI defines that this server cannot honour is either absent from these models or refused by name in
`check_supported`: a body with a field not declared here is a 400 naming it (extra="forbid"), never silently
ignored. Every field is taken as its JSON type only (strict): `"stream": "yes"`, `"n": "2"`, `"temperature": "0.5"`,
`"parallel_tool_calls": 0`, `"top_p": true` are 400s, as OpenAI answers them, never coerced. An integer is a
number (`"temperature": 1`), as in JSON Schema and OpenAI's API.
"""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator

from bls.batch import decode_json
from bls.errors import InvalidRequest
from openai_api.errors import invalid, unsupported

_MAX_STOP_STRINGS = 4  # OpenAI's limit ("Up to 4 sequences")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# ---- messages and tools ---------------------------------------------------------------------------------------------
class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="the call's arguments: the JSON text of an object")

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, arguments: str) -> str:
        try:
            value = decode_json(arguments, "arguments")  # nesting and lone surrogates measured as every JSON input
        except InvalidRequest as error:
            raise ValueError(error.problem) from None
        if not isinstance(value, dict):
            raise ValueError("must be the JSON text of an object")
        return arguments


class ToolCall(_Strict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(_Strict):
    """A message as OpenAI's clients send it. What Llama 3's template cannot take (parts other than text, a tool
    call beside text, a role's misplaced fields) is refused by the chat's own checks (bls.text.chat.validate_chat)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "ipython"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema of the arguments' object")
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _json_schema(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        # Checked whatever tool_choice is: under "auto" the schema only reaches the prompt, and a model asked to
        # follow a schema that is none would be served silently. The dialect is the schema's own "$schema", else
        # 2020-12 (OpenAI's and xgrammar's).
        if parameters is not None:
            validator = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
            try:
                validator.check_schema(parameters)
            except jsonschema.SchemaError as error:
                where = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in error.absolute_path)
                raise ValueError(f"is not a valid JSON schema: {error.message}"
                                 f"{f' (at parameters{where})' if where else ''}") from None
        return parameters


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class StreamOptions(_Strict):
    include_usage: bool = False
    # openai-python also defines include_obfuscation (padding against side channels): refused, as undeclared.


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class JsonSchemaFormat(_Strict):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


# Every integer that becomes an int32 tensor of the BLS (max_tokens, top_k, min_tokens) is at most this: numpy would
# wrap a larger one silently (2**32 + 5 tokens as 5) or fail with an OverflowError, where the client is owed a 400.
INT32_MAX = 2**31 - 1

# Generations one request may start (chat: n; completions: n x prompts): each is an engine sequence, and a request
# that needs more than the engine can hold and queue at once could only ever be refused (503) or starve the others.
MAX_GENERATIONS = 16


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    n: int = Field(default=1, ge=1, le=MAX_GENERATIONS)
    stop: str | list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # An end-user id for abuse monitoring: logged with the response's id.
    user: str | None = None
    # Extensions that vLLM's and TensorRT-LLM's OpenAI servers also take (benchmark clients send them): sampling's
    # top_k, a least output length, and generation to max_tokens whatever the model's end of turn.
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    ignore_eos: bool = False

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > _MAX_STOP_STRINGS:
            raise invalid("stop", f"at most {_MAX_STOP_STRINGS} sequences, got {len(stops)}")
        if any(not stop for stop in stops):
            raise invalid("stop", "an empty stop sequence would stop before the first token")
        return stops

    def check_common(self) -> None:
        if self.logit_bias:
            raise unsupported("logit_bias")
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "is only allowed with stream=true")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = Field(default=None, min_length=1)  # [] is a 400, as OpenAI and vLLM answer it
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    def output_limit(self) -> int | None:
        if self.max_completion_tokens is not None and self.max_tokens is not None \
                and self.max_completion_tokens != self.max_tokens:
            raise invalid("max_completion_tokens", "and max_tokens (its deprecated name) differ: send one")
        return self.max_completion_tokens or self.max_tokens

    def check_supported(self) -> None:
        self.check_common()
        if self.top_logprobs:
            raise unsupported("top_logprobs", "must be 0: the engine returns the chosen tokens' log probabilities, "
                                              "not alternatives")
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs", "needs logprobs=true")
        if self.tool_choice not in (None, "none", "auto") and not self.tools:
            raise invalid("tool_choice", "needs tools")
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice)
        if forced and self.response_format is not None and self.response_format.type != "text":
            raise invalid("response_format", "cannot be combined with a required or named tool_choice (both are "
                                             "enforced by one grammar)")
        if self.response_format is not None:
            if self.response_format.type == "json_schema":
                if self.response_format.json_schema is None or self.response_format.json_schema.schema_ is None:
                    raise invalid("response_format", "json_schema needs json_schema.schema")
            elif self.response_format.json_schema is not None:
                raise invalid("response_format", "json_schema is only allowed with type json_schema")


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1, le=INT32_MAX)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not prompts or any(not p for p in prompts):
            raise invalid("prompt", "must be a non-empty string or a list of non-empty strings")
        if len(prompts) * self.n > MAX_GENERATIONS:
            raise invalid("prompt", f"{len(prompts)} prompts x n={self.n} generations: at most {MAX_GENERATIONS} a "
                                    "request")
        return prompts

    def check_supported(self) -> None:
        self.check_common()
        if self.suffix:
            raise unsupported("suffix", "is not supported: Llama 3 has no fill-in-the-middle format")
        if self.best_of not in (None, 1) and self.best_of != self.n:
            raise unsupported("best_of", "only best_of = n (or 1) is supported: choices are not ranked")
        if self.logprobs:
            raise unsupported("logprobs", "must be 0 or null: the engine returns the chosen tokens' log "
                                          "probabilities, not alternatives")
        if self.echo and self.logprobs is not None:
            raise unsupported("echo", "with logprobs needs the prompt's log probabilities, which the engine does "
                                      "not return")


def field_of(location: tuple, body: Any) -> str:
    """A pydantic error's location as OpenAI's `param` ("messages[0].content"): its steps while they lead into the
    body, and a missing field's name last; pydantic's own steps (a union member's or a validator's name) are not the
    body's and end it."""
    parts: list[str] = []
    value = body
    for position, step in enumerate(location):
        if isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            parts.append(f"[{step}]")
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict) and (step in value or position == len(location) - 1):
            parts.append(("." if parts else "") + step)
            value = value.get(step)
        else:
            break
    return "".join(parts) or "body"


# ---- responses ------------------------------------------------------------------------------------------------------
# What the routes send, declared in /openapi.json (openai-python's `ChatCompletion`, `Completion`, `Model` types, as
# far as this server fills them). The app writes the JSON itself (openai_api/app.py's _Shapes): these models are
# never instantiated per request, and the schema fuzz (tests/integration/test_openai_schema_fuzz.py) holds every
# response to them.
class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseFunctionCall(_Response):
    name: str
    arguments: str


class ResponseToolCall(_Response):
    id: str
    type: Literal["function"]
    function: ResponseFunctionCall


class AssistantMessage(_Response):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None  # present when the choice is tool calls


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[TokenLogprob]


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChatLogprobs | None


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: None
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    finish_reason: Literal["stop", "length"]
    logprobs: CompletionLogprobs | None


class Completion(_Response):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class Model(_Response):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    parent: str | None  # the base model's id for a LoRA adapter (vLLM's convention), null for the base


class ModelList(_Response):
    object: Literal["list"]
    data: list[Model]


class ErrorObject(_Response):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(_Response):
    error: ErrorObject


# Streamed (stream=true): each server-sent event's data is one of these chunks, an ErrorResponse (an error after the
# stream started: its last event), or "[DONE]" (the last event of a stream that ended well).
class ChunkFunction(_Response):
    name: str | None = None  # in a call's first delta only
    arguments: str


class ChunkToolCall(_Response):
    index: int
    id: str | None = None  # id, type and name come once per call, first; then only pieces of its arguments
    type: Literal["function"] | None = None
    function: ChunkFunction


class ChunkDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChunkToolCall] | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: ChunkDelta
    finish_reason: Literal["stop", "length", "tool_calls"] | None
    logprobs: ChatLogprobs | None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]  # [] in the usage chunk (stream_options.include_usage)
    usage: Usage | None


class CompletionChunkChoice(_Response):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None


class CompletionChunk(_Response):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None
