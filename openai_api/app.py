"""The HTTP application: routes, authentication, request limits, and the OpenAI response shapes.

Responses and stream chunks have the shapes of the official `openai` package's types (`ChatCompletion`,
`ChatCompletionChunk`, `Completion`); errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from bls.batch import LONE_SURROGATE, MAX_JSON_DEPTH, lone_surrogate_at, refuse_deep_json
from bls.errors import InvalidRequest
from bls.text.chat import validate_chat
from openai_api.errors import ApiError, invalid, unsupported
from openai_api.generation import (
    CallArguments,
    CallStart,
    Delta,
    End,
    Event,
    Sampling,
    ToolMode,
    bls_inputs,
    choice_events,
    merged,
)
from openai_api.metrics import ApiMetrics
from openai_api.models import ServedModels
from openai_api.openapi import ERROR_RESPONSES, complete_openapi, request_body, stream_content
from openai_api.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Completion,
    CompletionChunk,
    CompletionRequest,
    Model,
    ModelList,
    NamedToolChoice,
    field_of,
)
from openai_api.tools import call_id, forced_call_schema
from openai_api.triton import TritonBls, text

log = logging.getLogger("openai_api")


@dataclass(frozen=True)
class Settings:
    triton_grpc: str  # host:port of tritonserver's gRPC endpoint
    model_name: str  # the base model's id: clients send it as `model`; /v1/models lists it
    adapters: tuple[str, ...] = ()  # the repository's LoRA adapters: ids a request's `model` may name instead
    api_keys: tuple[str, ...] = ()  # none: no authentication
    max_body_bytes: int = 8 * 1024 * 1024
    default_max_tokens: int = 1024  # a request that sets no limit; finish_reason "length" says it was reached
    created: int = 0  # /v1/models' `created`


def create_app(settings: Settings) -> FastAPI:
    metrics = ApiMetrics()
    served = ServedModels(settings.model_name, settings.adapters, settings.created)
    state: dict[str, TritonBls] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["bls"] = TritonBls(settings.triton_grpc)
        log.info("serving %r (LoRA adapters: %s) from tensorrt_llm_bls at %s", settings.model_name,
                 ", ".join(settings.adapters) or "none", settings.triton_grpc)
        # What the worker holds by now (modules, the app, pydantic's and FastAPI's tables: most of its heap) is out of
        # the garbage collector's full collections from here on: each one scanned it all, a 35-65 ms pause of every
        # stream, one in the first 65-130k streamed responses of a worker (issue 49, tools/api_cost.py).
        gc.freeze()
        yield
        gc.unfreeze()  # collectable again at exit (frozen objects are never freed: extensions report them as leaks)
        await state["bls"].close()
        metrics.close()

    # /openapi.json declares every route's request body and responses (openai_api/openapi.py); no docs UI.
    app = FastAPI(title="llama3-triton OpenAI-compatible API", lifespan=lifespan, docs_url=None, redoc_url=None)
    complete_openapi(app, (settings.model_name, *settings.adapters))

    def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
        """Every error answer of this API: OpenAI's shape, counted in llama3_api_request_errors by status."""
        metrics.errors.labels(settings.model_name, str(error.status)).inc()
        if error.retry_after:
            headers = {**(headers or {}), "Retry-After": str(error.retry_after)}
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    app.add_middleware(_BodyLimit, max_bytes=settings.max_body_bytes, respond=error_response)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        # A route that does not exist (404) or a method it does not take (405, whose Allow header, RFC 9110, lists
        # the methods it does take).
        kind = "not_found" if error.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(error.status_code, f"{request.method} {request.url.path}: {error.detail}",
                                       type=kind), headers=error.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        # Starlette calls this (outermost, before any response started) for an exception no route handled, then
        # re-raises it, so the server's log has its traceback; the client gets OpenAI's shape, never the traceback.
        return error_response(ApiError(500, f"internal error ({type(error).__name__}); see the API's log",
                                       type="server_error", code="internal_error"))

    def authorize(request: Request) -> None:
        if not settings.api_keys:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        # Every key is compared, in constant time: neither the time nor the order says which one came close.
        matches = [hmac.compare_digest(key.encode(), known.encode()) for known in settings.api_keys]
        if scheme.lower() != "bearer" or not any(matches):
            raise ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                           code="invalid_api_key")

    @app.get("/health/ready", response_class=Response,
             responses={200: {"description": "tritonserver and tensorrt_llm_bls are ready"},
                        503: {"description": "not ready"}})
    async def ready():
        if await state["bls"].ready():
            return Response(status_code=200)
        return Response(status_code=503)

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                              "description": "Prometheus text"}})
    async def prometheus():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES)
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": served.cards()}

    @app.get("/v1/models/{model:path}", response_model=Model, responses=ERROR_RESPONSES)
    async def model(request: Request, model: str):
        authorize(request)
        return served.card(model)

    @app.post("/v1/chat/completions", response_model=ChatCompletion,
              responses={**ERROR_RESPONSES, **stream_content(ChatCompletionChunk)},
              openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(request: Request):
        authorize(request)
        body = await _parse(request, ChatCompletionRequest)
        adapter = served.bls_inputs(body.model)
        body.check_supported()
        prompt, tools = _chat_prompt(body)
        prompt.update(adapter)
        max_tokens = body.output_limit() or settings.default_max_tokens
        sampling = _sampling(body, max_tokens, logprobs=body.logprobs, guide=_chat_guide(body))
        streams = [_choice(i, prompt, sampling, tools) for i in range(body.n)]
        try:
            return await _respond(request, body, streams, _ChatShapes(body, body.model))
        except ApiError as error:
            if tools is not None and tools.kind == "forced" and error.param == "response_format":
                error.param = "tools"  # the grammar the engine refused is the tools' (a schema it cannot compile)
            if body.output_limit() is None:
                _explain_default_limit(error)
            raise

    @app.post("/v1/completions", response_model=Completion,
              responses={**ERROR_RESPONSES, **stream_content(CompletionChunk)},
              openapi_extra=request_body(CompletionRequest))
    async def completions(request: Request):
        authorize(request)
        body = await _parse(request, CompletionRequest)
        adapter = served.bls_inputs(body.model)
        body.check_supported()
        prompts = body.prompts()
        sampling = _sampling(body, body.max_tokens or settings.default_max_tokens,
                             logprobs=body.logprobs is not None, guide=None)
        streams = [_choice(p * body.n + i, {"text_input": text(prompt), **adapter}, sampling, None, seed_offset=i)
                   for p, prompt in enumerate(prompts) for i in range(body.n)]
        try:
            return await _respond(request, body, streams, _CompletionShapes(body, body.model, prompts))
        except ApiError as error:
            if "max_tokens" not in body.model_fields_set:
                _explain_default_limit(error)
            raise

    def _choice(index: int, prompt: dict, sampling: Sampling, tools: ToolMode | None, seed_offset: int | None = None):
        inputs = bls_inputs(prompt, sampling, index if seed_offset is None else seed_offset)
        return choice_events(state["bls"], inputs, index, sampling.stops, tools, metrics, settings.model_name,
                             time.monotonic())

    async def _respond(request: Request, body, streams: list[AsyncIterator[Event]], shapes: _Shapes):
        if body.user:
            log.info("%s %s for user %r", request.url.path, shapes.id, body.user)
        metrics.in_flight.labels(settings.model_name).inc()
        events = merged(streams)
        if not body.stream:
            try:
                return JSONResponse(await _until_disconnected(request, _collect(events, shapes)))
            finally:
                metrics.in_flight.labels(settings.model_name).dec()
        # The first event is awaited before the response starts, so a request Triton refuses gets its HTTP status.
        try:
            first = await anext(events)
        except BaseException:
            metrics.in_flight.labels(settings.model_name).dec()
            await events.aclose()
            raise
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def sse() -> AsyncIterator[str]:
            finished = False
            try:
                async with aclosing(events):
                    yield "".join(_sse(chunk) for chunk in shapes.start_chunks()) + shapes.lines(first)
                    async for event in events:
                        yield shapes.lines(event)
                    if include_usage:
                        yield _sse(shapes.usage_chunk())
                    yield "data: [DONE]\n\n"
                    finished = True
            except Exception as error:  # after the response started: the stream's last event is the error
                if not isinstance(error, ApiError):
                    log.exception("%s: unexpected error in a stream", request.url.path)
                    error = ApiError(500, f"internal error ({type(error).__name__}); see the API's log",
                                     type="server_error", code="internal_error")
                metrics.errors.labels(settings.model_name, str(error.status)).inc()
                yield _sse(error.body())
                finished = True
            finally:
                if not finished:
                    metrics.disconnects.labels(settings.model_name).inc()
                    log.info("client left %s; its generations are cancelled", request.url.path)
                metrics.in_flight.labels(settings.model_name).dec()

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _explain_default_limit(error: ApiError) -> None:
        """A refused output limit the client never set is the server's default: say so, and what to do."""
        if error.param == "max_tokens":
            error.message += (f" (the request set no max_tokens: the server's default is {settings.default_max_tokens};"
                              " send a smaller max_tokens)")

    async def _until_disconnected(request: Request, work):
        """A non-streamed response's work, cancelled (and with it its BLS requests) when the client leaves."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    metrics.disconnects.labels(settings.model_name).inc()
                    task.cancel()
                    raise ApiError(499, "the client closed the connection", code="client_closed_request")
        finally:
            if not task.done():
                task.cancel()

    return app


# ---- requests -------------------------------------------------------------------------------------------------------
async def _parse(request: Request, model: type[BaseModel]):
    """The body as `model`: JSON nested at most MAX_JSON_DEPTH levels (as the Triton side), no NaN or infinities,
    no lone surrogate escape in any string (it is no text: a 400 naming the field), every field known (a field this
    server does not take is a 400 naming it) and of its JSON type."""
    raw = await request.body()
    try:
        payload = raw.decode("utf-8")
        refuse_deep_json(payload, "body", MAX_JSON_DEPTH)
        data = json.loads(payload, parse_constant=_refuse_constant)
    except InvalidRequest as error:
        raise invalid(None, str(error)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise invalid(None, f"the body is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise invalid(None, "the body must be a JSON object")
    where = lone_surrogate_at(data)
    if where is not None:
        raise invalid(where.lstrip("."), LONE_SURROGATE)
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        param = field_of(first["loc"], data)
        if first["type"] == "extra_forbidden":
            raise unsupported(param) from None
        raise invalid(param, first["msg"]) from None


def _refuse_constant(name: str):
    raise InvalidRequest("body", f"{name} is not a number JSON allows")


def _sampling(body, max_tokens: int, logprobs: bool, guide) -> Sampling:
    defaults = Sampling(max_tokens=max_tokens, stops=[])
    return Sampling(max_tokens=max_tokens, stops=body.stop_strings(),
                    temperature=defaults.temperature if body.temperature is None else body.temperature,
                    top_p=defaults.top_p if body.top_p is None else body.top_p, seed=body.seed,
                    presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                    logprobs=logprobs, guide=guide, top_k=body.top_k, min_tokens=body.min_tokens,
                    ignore_eos=body.ignore_eos)


def _chat_prompt(body: ChatCompletionRequest) -> tuple[dict, ToolMode | None]:
    """The BLS's `messages` input (the conversation as data: our preprocessing applies the template) and how the
    output is read for tool calls."""
    messages = [_message(index, message) for index, message in enumerate(body.messages)]
    _check_tool_results(messages)
    tool_list = _tools(body)
    chat: Any = {"messages": messages, "tools": tool_list} if tool_list else messages
    try:
        validate_chat(json.loads(json.dumps(chat)), "messages")  # the preprocessing's own checks, answered here
    except InvalidRequest as error:
        # validate_chat's problems name a "message N" or a "tool N" (bls.text.chat).
        raise invalid("tools" if error.problem.startswith("tool") else "messages", error.problem) from None
    tools = None
    if tool_list and body.tool_choice != "none":
        names = frozenset(tool["function"]["name"] for tool in tool_list)
        if isinstance(body.tool_choice, NamedToolChoice) and body.tool_choice.function.name not in names:
            raise invalid("tool_choice", f"names {body.tool_choice.function.name!r}, which is not in tools")
        forced = body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice)
        tools = ToolMode("forced" if forced else "auto", names)
    return {"messages": text(json.dumps(chat, ensure_ascii=False))}, tools


def _tools(body: ChatCompletionRequest) -> list[dict] | None:
    """The request's tools as our `messages` input takes them (the fields the client set)."""
    if not body.tools:
        return None
    return [{"type": tool.type, "function": {key: value for key, value in tool.function.model_dump().items()
                                             if value is not None}} for tool in body.tools]


def _message(index: int, message: ChatMessage) -> dict:
    """An OpenAI message as our `messages` takes it: text parts joined, "developer" (OpenAI's newer name for the
    system role) as "system"; what Llama 3 cannot take is refused naming it."""
    message = message.model_dump(exclude_none=True)
    where = f"messages[{index}]"
    if message.get("role") == "developer":
        message["role"] = "system"
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part_index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise unsupported(f"{where}.content[{part_index}]", "only text parts are supported (a text model)")
            parts.append(part["text"])
        message["content"] = "".join(parts)
    if content is None and message.get("tool_calls"):
        message["content"] = ""
    return message


def _check_tool_results(messages: list[dict]) -> None:
    """OpenAI's rule for tool results: each answers a call of the assistant message before it (Llama's template
    would render one anywhere, and the model could not tell which call it answers)."""
    call_ids: set[str] = set()
    for index, message in enumerate(messages):
        if message.get("role") == "assistant":
            call_ids = {call.get("id") for call in message.get("tool_calls") or [] if isinstance(call, dict)}
        elif message.get("role") == "tool":
            if message.get("tool_call_id") not in call_ids:
                raise invalid(f"messages[{index}].tool_call_id",
                              "a tool message must answer a tool call of the assistant message before it (by its id)")
        else:
            call_ids = set()


def _chat_guide(body: ChatCompletionRequest) -> tuple[str, str | None] | None:
    if body.tools and (body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice)):
        name = body.tool_choice.function.name if isinstance(body.tool_choice, NamedToolChoice) else None
        return "json_schema", json.dumps(forced_call_schema(_tools(body), name))
    if body.response_format is None or body.response_format.type == "text":
        return None
    if body.response_format.type == "json_object":
        return "json", None
    return "json_schema", json.dumps(body.response_format.json_schema.schema_)


# A str as JSON, exactly json.dumps(text, ensure_ascii=False): the C function that call ends in (CPython's
# json.encoder.JSONEncoder.encode for a str), without making an encoder for each streamed response.
_json_string = json.encoder.encode_basestring


def _sse(chunk: dict) -> str:
    return f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n"


# ---- responses ------------------------------------------------------------------------------------------------------
async def _collect(events: AsyncIterator[Event], shapes: _Shapes) -> dict:
    async with aclosing(events):
        async for event in events:
            shapes.add(event)
    return shapes.response()


class _Shapes:
    """Turns a request's events into its response (non-streamed) or chunks (streamed), counting usage."""

    def __init__(self, model: str, n_choices: int, id_prefix: str):
        self.id = f"{id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.n_choices = n_choices
        self.prompt_tokens: dict[int, int] = {}
        self.completion_tokens = 0

    def count(self, event: End, prompt_group: int) -> None:
        # A prompt is counted once however many choices it has (as OpenAI counts n > 1).
        self.prompt_tokens[prompt_group] = event.prompt_tokens
        self.completion_tokens += event.completion_tokens

    def usage(self) -> dict:
        prompt = sum(self.prompt_tokens.values())
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens}

    def usage_chunk(self) -> dict:
        return {**self._chunk_head(), "choices": [], "usage": self.usage()}

    def _chunk_head(self) -> dict:
        raise NotImplementedError

    def start_chunks(self) -> list[dict]:
        return []

    def lines(self, event: Event) -> str:
        """The server-sent events of one event. A text delta without log probabilities, nearly every event of a
        stream, is written from a prefix made once (the same JSON as the dict path, without building it)."""
        if isinstance(event, Delta) and not self.logprobs:
            return f"{self._text_prefixes[event.index]}{_json_string(event.text)}{self._text_suffix}"
        return "".join(_sse(chunk) for chunk in self.chunks(event))

    def _text_line_parts(self, text_key: str) -> None:
        """_text_prefixes[i] + JSON string + _text_suffix: choice i's chunk carrying that text."""
        head = json.dumps(self._chunk_head(), separators=(",", ":"))[:-1]
        self._text_prefixes = [f'data: {head},"choices":[{{"index":{i},{text_key}' for i in range(self.n_choices)]
        self._text_suffix = ('}' if text_key.startswith('"delta"') else '') + \
            ',"finish_reason":null,"logprobs":null}],"usage":null}\n\n'


class _ChatShapes(_Shapes):
    def __init__(self, body: ChatCompletionRequest, model: str):
        super().__init__(model, body.n, "chatcmpl")
        self.logprobs = body.logprobs
        self.choices = [{"index": i, "message": {"role": "assistant", "content": None}, "finish_reason": None,
                         "logprobs": {"content": []} if body.logprobs else None} for i in range(body.n)]
        self.texts = [[] for _ in range(body.n)]
        self._text_line_parts('"delta":{"content":')

    def _chunk_head(self) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model}

    def add(self, event: Event) -> None:
        choice = self.choices[event.index]
        if isinstance(event, Delta):
            self.texts[event.index].append(event.text)
            if self.logprobs:
                choice["logprobs"]["content"] += _chat_logprobs(event.logprobs)
        elif isinstance(event, CallStart):
            choice["message"].setdefault("tool_calls", []).append(
                {"id": call_id(), "type": "function", "function": {"name": event.name, "arguments": ""}})
        elif isinstance(event, CallArguments):
            choice["message"]["tool_calls"][event.position]["function"]["arguments"] += event.text
        else:
            self.count(event, 0)
            choice["finish_reason"] = event.finish_reason
            text = "".join(self.texts[event.index])
            if text or "tool_calls" not in choice["message"]:
                choice["message"]["content"] = text

    def response(self) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": self.choices, "usage": self.usage()}

    def start_chunks(self) -> list[dict]:
        # The role goes once per choice, first, as OpenAI streams it.
        return [self._chunk(i, {"role": "assistant", "content": ""}) for i in range(self.n_choices)]

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None, logprobs=None) -> dict:
        return {**self._chunk_head(), "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason,
                                                   "logprobs": logprobs}], "usage": None}

    def chunks(self, event: Event) -> list[dict]:
        if isinstance(event, Delta):
            logprobs = {"content": _chat_logprobs(event.logprobs)} if self.logprobs else None
            return [self._chunk(event.index, {"content": event.text}, logprobs=logprobs)]
        # Per call: its id, type and name once, then pieces of its arguments (openai-python concatenates them).
        if isinstance(event, CallStart):
            head = {"index": event.position, "id": call_id(), "type": "function",
                    "function": {"name": event.name, "arguments": ""}}
            return [self._chunk(event.index, {"tool_calls": [head]})]
        if isinstance(event, CallArguments):
            return [self._chunk(event.index, {"tool_calls": [{"index": event.position,
                                                              "function": {"arguments": event.text}}]})]
        self.count(event, 0)
        return [self._chunk(event.index, {}, finish_reason=event.finish_reason)]


def _chat_logprobs(entries: list[tuple[str, float]]) -> list[dict]:
    return [{"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []}
            for token, lp in entries]


class _CompletionShapes(_Shapes):
    def __init__(self, body: CompletionRequest, model: str, prompts: list[str]):
        super().__init__(model, len(prompts) * body.n, "cmpl")
        self.n = body.n
        self.echo = body.echo
        self.prompts = prompts
        self.logprobs = body.logprobs is not None
        self.texts: list[list[str]] = [[prompts[i // body.n]] if body.echo else [] for i in range(self.n_choices)]
        self.entries: list[list[tuple[str, float]]] = [[] for _ in range(self.n_choices)]
        self.finish: list[str | None] = [None] * self.n_choices
        self._text_line_parts('"text":')

    def _chunk_head(self) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    def add(self, event: Event) -> None:
        if isinstance(event, Delta):
            self.texts[event.index].append(event.text)
            self.entries[event.index] += event.logprobs
        elif isinstance(event, End):
            self.count(event, event.index // self.n)
            self.finish[event.index] = event.finish_reason

    def response(self) -> dict:
        choices = [{"index": i, "text": "".join(self.texts[i]), "finish_reason": self.finish[i],
                    "logprobs": _completion_logprobs(self.entries[i]) if self.logprobs else None}
                   for i in range(self.n_choices)]
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    def _chunk(self, index: int, text_: str, finish_reason=None, logprobs=None) -> dict:
        return {**self._chunk_head(), "choices": [{"index": index, "text": text_, "finish_reason": finish_reason,
                                                   "logprobs": logprobs}], "usage": None}

    def start_chunks(self) -> list[dict]:
        return [self._chunk(i, self.prompts[i // self.n]) for i in range(self.n_choices)] if self.echo else []

    def chunks(self, event: Event) -> list[dict]:
        if isinstance(event, Delta):
            logprobs = _completion_logprobs(event.logprobs) if self.logprobs else None
            return [self._chunk(event.index, event.text, logprobs=logprobs)]
        if isinstance(event, End):
            self.count(event, event.index // self.n)
            return [self._chunk(event.index, "", finish_reason=event.finish_reason)]
        return []


def _completion_logprobs(entries: list[tuple[str, float]]) -> dict:
    offsets, position = [], 0
    for token, _ in entries:
        offsets.append(position)
        position += len(token)
    return {"tokens": [t for t, _ in entries], "token_logprobs": [lp for _, lp in entries],
            "top_logprobs": None, "text_offset": offsets}


class _BodyLimit:
    """Refuses a request body over max_bytes with 413 (by its Content-Length, and while it is read: chunked bodies
    declare none), before any of it is parsed. `respond` makes the error's response (and counts it)."""

    def __init__(self, app: Callable, max_bytes: int, respond: Callable[[ApiError], Response]):
        self.app = app
        self.max_bytes = max_bytes
        self.respond = respond

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_large = ApiError(413, f"the request body exceeds {self.max_bytes} bytes", code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self.respond(too_large)(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large
            return message

        try:
            await self.app(scope, limited_receive, send)
        except ApiError as error:
            if error is not too_large:
                raise
            await self.respond(too_large)(scope, receive, send)
