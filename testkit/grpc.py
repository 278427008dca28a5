"""gRPC helpers of the tests and tools: typed input tensors and one request over a gRPC stream."""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype


def tensor(name: str, value) -> grpcclient.InferInput:
    array = np.asarray(value)
    if array.dtype.kind in "US":
        encoded = [v.encode() if isinstance(v, str) else v for v in array.reshape(-1)]
        array = np.array(encoded, dtype=object).reshape(array.shape)
    item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    item.set_data_from_numpy(array)
    return item


@dataclass
class StreamResult:
    responses: list[dict] = field(default_factory=list)  # output name -> numpy array, per response
    arrival_times: list[float] = field(default_factory=list)  # time.monotonic() of each data response
    error: str | None = None
    completed: bool = False


def grpc_stream(grpc_url: str, model: str, inputs: dict, outputs: list[str], *, request_id: str | None = None,
                cancel_after: int | None = None, timeout: float = 120, sequence_id: int | str = 0,
                on_response: Callable[[], None] | None = None) -> StreamResult:
    """One request over a gRPC stream. cancel_after=N: cancel the stream after N data responses; sequence_id: the
    request's correlation id (0: none); on_response(): called at each data response, as it comes."""
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    result = StreamResult()
    try:
        client.async_stream_infer(
            model, [tensor(k, v) for k, v in inputs.items()], request_id=request_id or uuid.uuid4().hex,
            outputs=[grpcclient.InferRequestedOutput(o) for o in outputs], enable_empty_final_response=True,
            sequence_id=sequence_id,
        )
        while True:
            response, error = events.get(timeout=timeout)
            if error is not None:
                result.error = str(error)
                break
            data = {o: response.as_numpy(o) for o in outputs if response.as_numpy(o) is not None}
            if data:
                result.responses.append(data)
                result.arrival_times.append(time.monotonic())
                if on_response is not None:
                    on_response()
            if response.get_response().parameters["triton_final_response"].bool_param:
                result.completed = True
                break
            if cancel_after is not None and len(result.responses) >= cancel_after:
                break
    finally:
        client.stop_stream(cancel_requests=cancel_after is not None)
        client.close()
    return result
