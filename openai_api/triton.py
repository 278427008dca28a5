"""tensorrt_llm_bls over gRPC: one bidirectional stream per generation (tritonclient's asyncio client).

A generation is an async iterator of BLS responses; leaving it early (the HTTP client went away, a stop string was
met) cancels the gRPC call, which Triton turns into the request's cancellation: the BLS stops the engine
(docs/design.md, "Streaming, speculation, cancellation").
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from bls.contract import BLS_MODEL
from openai_api.errors import ApiError, from_triton

_OUTPUTS = ("text_output", "finish_reason", "num_input_tokens", "num_output_tokens", "output_log_probs")


@dataclass
class BlsResponse:
    """One streamed response of tensorrt_llm_bls: the text it adds, and what the final one carries."""

    text: str
    # output_log_probs (when asked): one per token generated SO FAR, not only this response's (the engine streams
    # them cumulatively and the BLS passes each engine response's on: bls.response_loop.PER_TOKEN_AXIS). A view of
    # the response's bytes: a reader converts only the tail it needs.
    log_probs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    finish_reason: str | None = None  # set on the final response only
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None


def _tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    item.set_data_from_numpy(value)
    return item


def scalar(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=object)


class TritonBls:
    """The connection to tritonserver's gRPC endpoint (one channel, shared by every request of this process)."""

    def __init__(self, url: str, model: str = BLS_MODEL):
        self.url = url
        self.model = model
        self._client = grpcclient.InferenceServerClient(url)

    async def close(self) -> None:
        await self._client.close()

    async def ready(self) -> bool:
        try:
            return await self._client.is_server_ready() and await self._client.is_model_ready(self.model)
        except InferenceServerException:
            return False

    async def generate(self, inputs: dict[str, np.ndarray]) -> AsyncIterator[BlsResponse]:
        """The BLS's responses to one streamed request, the final one last (it carries finish_reason). Raises ApiError
        for an error Triton answers with. Closing the iterator before the end cancels the request."""
        request_id = uuid.uuid4().hex

        async def requests():
            yield {"model_name": self.model, "inputs": [_tensor(k, v) for k, v in inputs.items()],
                   "outputs": [grpcclient.InferRequestedOutput(name) for name in _OUTPUTS], "request_id": request_id}

        try:
            stream = self._client.stream_infer(requests())
        except InferenceServerException as error:
            raise ApiError(503, f"tritonserver at {self.url}: {error.message()}", type="server_error",
                           code="unavailable", retry_after=1) from None
        ended = False  # the call is over on the server too: nothing to cancel
        try:
            async for result, error in stream:
                if error is not None:
                    ended = await _call_ended(stream)
                    raise from_triton(error.message())
                response = _read(result)
                if response.finish_reason is not None:
                    ended = await _call_ended(stream)
                    yield response
                    return
                yield response
            raise ApiError(502, f"tritonserver ended the stream of request {request_id} without a final response",
                           type="server_error", code="bad_gateway")
        except grpc.aio.AioRpcError as error:  # the channel failed mid-stream (tritonclient's aio iterator raises it)
            raise ApiError(503, f"tritonserver at {self.url}: {error.details()}", type="server_error",
                           code="unavailable", retry_after=1) from None
        finally:
            # A call still running (the client left, a stop string was met) is cancelled on the server, which stops
            # the engine. One whose request has ended is never cancelled: _call_ended says why.
            if not ended:
                stream.cancel()


# How long a call whose request has ended may take to end on the server (it ends as soon as Triton has written the
# final response: our only request was sent and the request stream closed); past it, it is cancelled after all.
CALL_END_S = 5.0


async def _call_ended(stream) -> bool:
    """Reads a call whose request has ended (final response, or an error) until the server ends it: whether it did.

    Cancelling such a call instead leaks it in Triton 2.51's gRPC frontend (src/grpc/stream_infer_handler.cc, r24.10):
    the stream's request state is never released, and with it the request object, which holds its model (core's
    InferenceRequest::model_shared_), so tensorrt_llm_bls never unloads and a stop runs into --exit-timeout-secs (10
    generations cancelled after their final response were enough here; test_server_exit.py's
    test_a_stop_after_clients_left_mid_request_is_clean). The 26.07 frontend's stream cancellation path is the same
    code (server r26.07; not run here). The final response is handed on once the call has ended: Triton ends it right
    after writing that response, as this client has closed its request stream."""
    async def drain() -> None:
        async for _ in stream:
            pass

    try:
        await asyncio.wait_for(drain(), CALL_END_S)
    except (TimeoutError, InferenceServerException):
        return False
    return True


def _read(result) -> BlsResponse:
    """A response's outputs, read straight from its protobuf (InferResult.as_numpy searches and copies per call: this
    runs for every streamed token). Triton sends outputs as raw bytes: BYTES elements as a 4-byte little-endian
    length and the bytes, FP32 and INT32 little-endian."""
    message = result.get_response()
    response = BlsResponse("")
    for output, raw in zip(message.outputs, message.raw_output_contents, strict=True):
        name = output.name
        if name == "text_output":
            response.text = "".join(_strings(raw))
        elif name == "output_log_probs":
            response.log_probs = np.frombuffer(raw, dtype="<f4")
        elif name == "finish_reason":
            response.finish_reason = _strings(raw)[0]
        elif name in ("num_input_tokens", "num_output_tokens"):
            setattr(response, name, int.from_bytes(raw[:4], "little", signed=True))
    return response


def _strings(raw: bytes) -> list[str]:
    strings, position = [], 0
    while position < len(raw):
        length = int.from_bytes(raw[position:position + 4], "little")
        strings.append(raw[position + 4:position + 4 + length].decode())
        position += 4 + length
    return strings
