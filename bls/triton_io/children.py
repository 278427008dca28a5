"""Calls to other models of the repository through the Python backend (BLS `exec`), one response each: the
one-response steps of every BLS (preprocessing, postprocessing) and, in a unary repository, the engines.

Streams (exec(decoupled=True)) are never read here: a streaming repository's engine streams go through the relay
(bls.relay.engine_streams). The Python backend stub deadlocks when one thread returns from exec(decoupled=True) while
another is woken in a response iterator (python_backend r24.10 to r26.07), and frees a finished iterator without
the GIL; one-response exec uses neither, so any thread may call infer().
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from bls.errors import ModelStepError
from bls.triton_io.lock import PB_LOCK

Tensors = dict[str, np.ndarray]


class InProcessModels:
    """The ModelCaller of a unary repository's BLS (bls.transports), and the relay transport's one-response calls."""

    def infer(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
              request_id: str = "") -> Tensors:
        """One response. The wait (exec) is outside PB_LOCK: a unary engine takes as long as a whole generation, and
        every other request of this process would wait behind it."""
        outputs = list(outputs)
        with PB_LOCK:
            child = pb_utils.InferenceRequest(
                model_name=model_name,
                inputs=[pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()],
                requested_output_names=outputs,
                request_id=request_id,
            )
        response = child.exec()
        with PB_LOCK:
            if response.has_error():
                raise ModelStepError(model_name, response.error().message(), int(response.error().code()))
            tensors = _copied_outputs(response, outputs)
            del response, child
            return tensors

    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterator[Tensors]:
        """A unary engine's one response, as a stream of one (what the generation reads)."""
        yield self.infer(model_name, inputs, outputs, request_id)

    def stream_each(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_response: Callable[[Tensors], bool]) -> bool:
        return on_response(self.infer(model_name, inputs, outputs, request_id))


def _copied_outputs(response: Any, names: Iterable[str]) -> Tensors:
    """The named outputs of a child response, copied: no array outlives the response's shared memory outside
    PB_LOCK (the caller holds it)."""
    tensors = {}
    for name in names:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        if tensor is not None:
            tensors[name] = tensor.as_numpy().copy()
    return tensors
