"""Where a request's responses go. Each sender ends its stream exactly once (also on errors: a decoupled client
would otherwise hang) and survives a client that has gone.

- StubSender: through the Python backend stub's response sender (the embedded engine; a unary BLS, one response).
- RelayedSender: a request that came through the relay: its responses are frames to the relay (bls.relay.sending
  FrameSender), written without PB_LOCK or a round trip to tritonserver. It has a StubSender for the one thing
  Triton must hear from this process: that the child request is complete, after the final frame.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from bls.relay.connection import RelayConnection
from bls.relay.frames import RelayedRequest
from bls.relay.sending import FrameSender
from bls.triton_io.lock import PB_LOCK
from bls.triton_io.responses import error_response, error_status, make_response


class StubSender:
    """A response sender through the stub. A model that is not decoupled may use one too (Python backend >= 23.10),
    for exactly one response with the FINAL flag (an error is sent that way too). Sends from several threads are
    serialised (PB_LOCK)."""

    def __init__(self, request: Any, model_name: str):
        with PB_LOCK:
            self._sender = request.get_response_sender()
            # Triton lists every output here when the client named none.
            self._requested = frozenset(request.requested_output_names())
        self._model_name = model_name
        self._closed = False
        self._cancelled = False

    @property
    def closed(self) -> bool:
        return self._closed

    def is_cancelled(self) -> bool:
        """Whether the client has gone (a round trip to Triton). Never blocks: while another pb_utils call of this
        process is in progress, the previous answer is returned. The embedded engine polls so from its scheduler
        (embedded_engine.cancellation, at a bounded rate): waiting for a send would tie generation to sending."""
        if not PB_LOCK.acquire(blocking=False):
            return self._cancelled
        try:
            self._cancelled = self._closed or self._sender.is_cancelled()
            return self._cancelled
        finally:
            PB_LOCK.release()

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        """Only the outputs the client asked for go into the response. The stub would drop the others itself,
        but inside ResponseSender::Send with the GIL released (python_backend src/response_sender.cc, from
        24.10 up to main of 2026-07, so also in the 26.07 container): a dropped BYTES output frees the numpy
        array the stub serialised it into, a Python deallocation without the GIL, which can corrupt the allocator
        while other threads run Python."""
        with PB_LOCK:
            response = make_response({name: value for name, value in outputs.items() if name in self._requested})
            self._send(lambda: response, final)

    def send_error(self, error: BaseException) -> None:
        """The error, as the stream's final response.

        Not apart from the FINAL flag (an error, then an empty final response): Triton 2.51's ensemble then
        counted the request as in flight forever, and every shutdown waited out --exit-timeout-secs.
        """
        self._send(lambda: error_response(error, self._model_name), final=True)

    def finish(self) -> None:
        """Close the stream with the FINAL flag alone (no-op if already closed)."""
        with PB_LOCK:
            if self._closed:
                return
            self._closed = True
            self._sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _send(self, build_response: Callable[[], Any], final: bool) -> None:
        with PB_LOCK:
            if self._closed:
                return
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            self._closed = final
            self._sender.send(build_response(), flags=flags)


class RelayedSender(FrameSender):
    """The responses of a relayed request, as frames to the relay (bls.relay.sending.FrameSender); its StubSender
    is for the one thing Triton must hear from this process: that the child request is complete, after the final
    frame."""

    def __init__(self, request: Any, model_name: str, relayed: RelayedRequest, connection: RelayConnection):
        completion = StubSender(request, model_name)  # only finish() is used: the child is complete
        super().__init__(relayed.stream, connection, completion.finish, lambda error: error_status(error, model_name))
