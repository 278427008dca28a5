"""The requests this server takes, as pydantic models of OpenAI's request bodies (openai-python's
`chat/completion_create_params.py`, `completion_create_params.py`).

Every field OpenAI defines that this server cannot honour is either absent from these models or refused by name in
`check_supported`: a body with a field not declared here is a 400 naming it (extra="forbid"), never silently
ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openai_api.errors import invalid, unsupported

_MAX_STOP_STRINGS = 4  # OpenAI's limit ("Up to 4 sequences")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=16)
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
    top_k: int | None = Field(default=None, ge=0)
    min_tokens: int | None = Field(default=None, ge=0)
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
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
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
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1)
    suffix: str | None = None

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not prompts or any(not p for p in prompts):
            raise invalid("prompt", "must be a non-empty string or a list of non-empty strings")
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


def field_of(location: tuple) -> str:
    """A pydantic error location as OpenAI's `param` ("messages[0].content")."""
    parts: list[str] = []
    for item in location:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item not in ("function-after", "union", "literal") and "[" not in str(item):
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "body"
