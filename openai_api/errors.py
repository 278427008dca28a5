"""OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, and Triton's errors mapped to HTTP."""

from __future__ import annotations

from bls.contract import PREPROCESSING, TENSORRT_LLM, TENSORRT_LLM_BLS

# What tritonserver says when it cannot take a request now (Triton's own queue, the BLS's pool, the engines, a model
# loading or unloading): the client may retry, so 503 with Retry-After.
# "is shutting down": the relay's and the handoff's word to the streams a stop ends (relay/relay.h kShutdownMessage);
# "Server is stopping": Triton's to a request that arrives during a stop (core's dynamic_batch_scheduler.cc).
_UNAVAILABLE_MARKS = ("at capacity", "Exceeds maximum queue size", "unloading", "unloaded", "is not ready",
                      "is not healthy", "UNAVAILABLE", "is shutting down", "Server is stopping")
_NOT_FOUND_MARKS = ("unknown model", "is not found")
# A Triton error that names one of these tensors is a request the client must fix (our models' InvalidRequest is
# "<tensor>: <problem>", optionally after the model's name).
_TENSOR_NAMES = frozenset(spec.name for contract in (TENSORRT_LLM_BLS, PREPROCESSING, TENSORRT_LLM)
                          for spec in contract.inputs)
# Tensor -> the OpenAI request field that set it (for `param`).
_PARAM_OF_TENSOR = {"messages": "messages", "MESSAGES": "messages", "text_input": "prompt", "QUERY": "prompt",
                    "max_tokens": "max_tokens", "REQUEST_OUTPUT_LEN": "max_tokens",
                    "request_output_len": "max_tokens", "input_ids": "messages", "input_lengths": "messages",
                    "stop_words": "stop",
                    "STOP_WORDS_DICT": "stop", "guided_decoding_guide": "response_format",
                    "guided_decoding_guide_type": "response_format", "temperature": "temperature", "top_p": "top_p",
                    "runtime_top_p": "top_p", "seed": "seed", "presence_penalty": "presence_penalty",
                    "frequency_penalty": "frequency_penalty", "lora_name": "model", "LORA_NAME": "model"}


class ApiError(Exception):
    """An error answered in OpenAI's shape with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, problem: str) -> ApiError:
    """A 400 naming the request field."""
    message = f"{param}: {problem}" if param else problem
    return ApiError(400, message, param=param, code="invalid_value")


def unsupported(param: str, why: str = "is not supported by this server") -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code="unsupported_parameter")


def from_triton(message: str) -> ApiError:
    """An error tritonserver answered a request with. gRPC streams carry the message, not Triton's code, so the class
    comes from the message: capacity and unloading -> 503 (retry), unknown model -> 404, a message naming an input
    tensor -> 400, anything else -> 500 (its message is the server's, which never holds a traceback)."""
    if any(mark in message for mark in _UNAVAILABLE_MARKS):
        return ApiError(503, message, type="server_error", code="unavailable", retry_after=1)
    if any(mark in message for mark in _NOT_FOUND_MARKS):
        return ApiError(404, message, code="model_not_found")
    tensor = _named_tensor(message)
    if tensor is not None:
        return ApiError(400, message, param=_PARAM_OF_TENSOR.get(tensor, tensor), code="invalid_value")
    return ApiError(500, message, type="server_error", code="internal_error")


def _named_tensor(message: str) -> str | None:
    # "tensorrt_llm_bls: preprocessing: MESSAGES: message 0 ..." -> the first segment that is a tensor's name.
    for segment in message.split(": ")[:4]:
        name = segment.strip()
        if name in _TENSOR_NAMES:
            return name
    return None
