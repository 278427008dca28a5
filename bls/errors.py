"""Errors that become clean, per-request Triton errors (never a traceback for the client)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request the client must fix. Becomes a Triton INVALID_ARG error naming the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Unavailable(RuntimeError):
    """The model cannot take this request now: at capacity, unloading, or its engine failed. Becomes a Triton
    UNAVAILABLE error (HTTP 503): the client may retry, here or on another replica."""


class GenerationCancelled(Exception):
    """An engine stream was cancelled because its client went away (bls.relay_engine.RelayedEngineStreams.cancel): the generation
    stops its engine and ends with finish_reason "cancelled"; never an error for anyone."""


class ModelStepError(RuntimeError):
    """A model this one called (preprocessing, the engine, the draft...) answered with an error.

    The message is the inner model's own message, prefixed with its name; it is passed on as is
    because the inner model already produced a client-facing text. `kind` keeps the inner error's class:
    "client" (the request must change), "unavailable" (retry later), "internal".
    """

    def __init__(self, model_name: str, message: str, kind: str = "client"):
        # The inner model's messages often name it already ("tensorrt_llm: at capacity ...").
        super().__init__(message if message.startswith(f"{model_name}: ") else f"{model_name}: {message}")
        self.model_name = model_name
        self.kind = kind
