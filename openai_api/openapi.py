"""/openapi.json: the API's routes with their request bodies and responses as they really are.

The request bodies are parsed by the app itself (openai_api.app._parse: JSON depth, NaN, lone surrogates, then the
pydantic models of openai_api.protocol), so FastAPI does not see them as parameters: their schemas are declared
here, generated from the same models. The responses are declared per route (response_model, ERROR_RESPONSES,
stream_content).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from openai_api.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    CompletionChunk,
    CompletionRequest,
    ErrorResponse,
)

_REQUEST_MODELS = (ChatCompletionRequest, CompletionRequest)
_CHUNK_MODELS = (ChatCompletionChunk, CompletionChunk)  # referenced by stream_content only
_REF = "#/components/schemas/{model}"

# Every error is OpenAI's error object. 400: a field refused (named in `param`); 401: a missing or wrong API key;
# 404: an unknown model id; 413: a body over --max-body-bytes; 500: an error of the server; 502: tritonserver ended a
# stream without its final response; 503: tritonserver or a model cannot take the request now (Retry-After).
ERROR_RESPONSES: dict = {status: {"model": ErrorResponse, "description": description} for status, description in (
    (400, "a field is refused: `param` names it"), (401, "a valid API key is required"),
    (404, "the model (or route) does not exist"), (413, "the body is too large"), (500, "an error of the server"),
    (502, "tritonserver ended a stream without its final response"),
    (503, "tritonserver cannot take the request now; retry after Retry-After seconds"))}


def stream_content(chunk: type[BaseModel]) -> dict:
    """A route's 200 with `stream: true`: server-sent events, each's data a `chunk`, an error after the stream started
    (its last event), or "[DONE]" last (Open API 3.1: `schema` describes one event, as schemathesis reads it)."""
    json_data = {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [{"$ref": _REF.format(model=chunk.__name__)},
                                             {"$ref": _REF.format(model=ErrorResponse.__name__)}]}}
    event = {"type": "object", "required": ["data"],
             "properties": {"event": {"const": "message"}, "data": {"anyOf": [{"const": "[DONE]"}, json_data]}}}
    return {200: {"description": "the completion; with stream=true, server-sent events (each data a chunk, an error, "
                                 "or [DONE] last)",
                  "content": {"text/event-stream": {"schema": event}}}}


def request_body(model: type[BaseModel]) -> dict:
    """A route's openapi_extra declaring `model` (a component, complete_openapi) as its JSON body."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def complete_openapi(app: FastAPI, model_ids: tuple[str, ...]) -> None:
    """The app's OpenAPI document with the request and stream chunk models as components (a request's `model` one
    of the served ids: another id is a 404) and without FastAPI's 422 responses (this app answers no 422: a refused
    field is a 400)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, definitions = models_json_schema(
                [*((model, "validation") for model in _REQUEST_MODELS),
                 *((model, "serialization") for model in _CHUNK_MODELS)], ref_template=_REF)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(definitions["$defs"])
            for model in _REQUEST_MODELS:
                components[model.__name__]["properties"]["model"] = {"type": "string", "enum": list(model_ids)}
            for path in schema["paths"].values():
                for operation in path.values():
                    operation["responses"].pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
