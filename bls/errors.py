"""Errors that become clean, per-request Triton errors (never a traceback for the client)."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Triton's error codes (TRITONSERVER_Error_Code, core's tritonserver.h; pb_utils.TritonError has the same
    values): how every error travels between our models, through the relay's frames as a number."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class InvalidRequest(ValueError):
    """A request the client must fix. Becomes a Triton INVALID_ARG error naming the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# A client that gets no error code tells "retry later" from other errors by these words, defined here only. Triton
# 2.51's gRPC streams carry a message and no code (its `triton_grpc_error` header would add the gRPC status, but on
# 2.51 it logs "HandleCancellation called even when the context was not cancelled" for every error and crashed
# tritonserver with SIGSEGV once in ~500 errors here: docs/openai.md, "Errors"), and its HTTP `generate` answers
# 400 for a decoupled Python model's UNAVAILABLE (server issue #7804; docs/operations.md).
RETRY_LATER = "retry later"  # ends the message of every Unavailable of our models
UNAVAILABLE_MARKS = (
    RETRY_LATER,
    "Exceeds maximum queue size",  # Triton core's queue policy, UNAVAILABLE (core src/scheduler_utils.cc)
    "please try again later",  # TensorRT-LLM's executor queue (cpp/tensorrt_llm/executor/executorImpl.cpp:
    #                            "Maximum queue size of %d has been reached, please try again later")
    "is not healthy",  # a Python backend stub that died: "Stub process '<instance>' is not healthy."
    "is shutting down",  # the relay's and the handoff's word to streams a stop ends (relay/relay.h kShutdownMessage)
    "Server is stopping",  # Triton core's to a request that arrives during a stop (dynamic_batch_scheduler.cc)
)

# Triton's words for a model it does not serve ("Request for unknown model: '<name>' is not found").
NOT_FOUND_MARKS = ("unknown model", "is not found")


class Unavailable(RuntimeError):
    """The model cannot take this request now: at capacity, unloading, or its engine failed. Becomes a Triton
    UNAVAILABLE error (HTTP 503): the client may retry, here or on another replica. The message is the reason
    followed by RETRY_LATER."""

    def __init__(self, reason: str):
        super().__init__(f"{reason}; {RETRY_LATER}")


def asks_to_retry(message: str) -> bool:
    """Whether an error's message is a refusal to be retried later (UNAVAILABLE_MARKS)."""
    return any(mark in message for mark in UNAVAILABLE_MARKS)


class GenerationCancelled(Exception):
    """An engine stream was cancelled because its client went away
    (bls.relay.engine_streams.RelayedEngineStreams.cancel): the generation stops its engine and ends with
    finish_reason "cancelled"; never an error for anyone."""


class ModelStepError(RuntimeError):
    """A model this one called (preprocessing, the engine, the draft...) answered with an error.

    The message is the inner model's own message, prefixed with its name; it is passed on as is
    because the inner model already produced a client-facing text. `code` is the inner error's Triton code, which
    alone decides what the client gets (bls.triton_io.responses.error_status): never the message's words.
    """

    def __init__(self, model_name: str, message: str, code: int):
        # The inner model's messages often name it already ("tensorrt_llm: at capacity ...").
        super().__init__(message if message.startswith(f"{model_name}: ") else f"{model_name}: {message}")
        self.model_name = model_name
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else ErrorCode.UNKNOWN

    @property
    def client_code(self) -> ErrorCode:
        """What our client gets: the request must change (INVALID_ARG, UNSUPPORTED, as given), retry later
        (UNAVAILABLE), or anything else from a model we called: INTERNAL (a NOT_FOUND of the engine is not the
        client's model missing)."""
        if self.code in (ErrorCode.INVALID_ARG, ErrorCode.UNSUPPORTED, ErrorCode.UNAVAILABLE):
            return self.code
        return ErrorCode.INTERNAL
