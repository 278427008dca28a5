"""Responses and errors: every failure becomes a Triton error code and a message naming the field or the model,
never a traceback (that goes to the log)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from bls.contract import ModelContract
from bls.errors import ErrorCode, InvalidRequest, ModelStepError, Unavailable
from bls.triton_io.requests import read_inputs

Tensors = dict[str, np.ndarray]


def respond_to_each(requests: list[Any], contract: ModelContract,
                    handle: Callable[[Tensors], Mapping[str, np.ndarray]], model_name: str) -> list[Any]:
    """One response per request for a non-decoupled model; a bad request fails alone, not its batch."""
    responses = []
    for request in requests:
        try:
            responses.append(make_response(handle(read_inputs(request, contract))))
        except Exception as error:  # noqa: BLE001 - becomes this request's error response
            responses.append(error_response(error, model_name))
    return responses


def make_response(outputs: Mapping[str, np.ndarray]) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, np.ascontiguousarray(array)) for name, array in outputs.items()]
    )


def error_response(error: BaseException, model_name: str) -> Any:
    """A client-facing error: the field and the problem, never a traceback (that goes to the log)."""
    code, message = error_status(error, model_name)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, getattr(pb_utils.TritonError, code.name)))


def error_status(error: BaseException, model_name: str) -> tuple[ErrorCode, str]:
    """The Triton error code and the message a client gets for `error` (unexpected ones are logged whole)."""
    if isinstance(error, InvalidRequest):
        return ErrorCode.INVALID_ARG, str(error)
    if isinstance(error, Unavailable):
        return ErrorCode.UNAVAILABLE, f"{model_name}: {error}"
    if isinstance(error, ModelStepError):
        return error.client_code, str(error)
    # From the exception itself: error_status is also called outside the `except` that caught it.
    details = "".join(traceback.format_exception(error))
    pb_utils.Logger.log_error(f"{model_name}: unexpected error\n{details}")
    return ErrorCode.INTERNAL, f"{model_name}: internal error ({type(error).__name__}: {error}); see the server log"
