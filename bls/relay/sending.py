"""The relay transport's sending: a stream's responses as frames on its process's relay connection (FrameSender),
the transport bls.response_loop's loop sends them through. Cancellation is the relay's word: the connection that
claimed the stream says when the client has gone (bls.transports)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import numpy as np

from bls.relay.connection import RelayConnection
from bls.relay.frames import encode_tensors, error_frame, response_frame


class FrameSender:
    """The responses of a relayed stream, as frames on its process's relay connection (bls.response_loop sends them).
    Cancellation is the relay's word, told to the connection that claimed the stream (bls.transports). What Triton
    must hear from this process, that the child request is complete, is `complete`'s job, after the final frame;
    `error_status` gives an error's code and message (both are bls.triton_io.senders.RelayedSender's, through the
    stub)."""

    def __init__(self, stream: int, connection: RelayConnection, complete: Callable[[], None],
                 error_status: Callable[[BaseException], tuple[int, str]]):
        self._stream = stream
        self._connection = connection
        self._complete = complete
        self._error_status = error_status
        self._ending = threading.Lock()  # _closed is set once, before the final frame
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def build(self, outputs: Mapping[str, np.ndarray]) -> bytes:
        """The outputs encoded (the relay drops those the client did not ask for)."""
        return encode_tensors(outputs)

    def send(self, outputs: Mapping[str, np.ndarray], final: bool = False) -> None:
        self.send_built(self.build(outputs), final)

    def send_built(self, response: bytes, final: bool = False) -> None:
        """A response built ahead (build()): the loop builds a round's responses before it sends them."""
        self._write(response_frame(self._stream, response, final), final)

    def send_error(self, error: BaseException) -> None:
        code, message = self._error_status(error)
        self._write(error_frame(self._stream, int(code), message), final=True)

    def finish(self) -> None:
        """Close the stream with a final response without outputs (no-op if already closed)."""
        self.send_built(encode_tensors({}), final=True)

    def _write(self, frame: bytes, final: bool) -> None:
        with self._ending:
            if self._closed:
                return
            self._closed = final
        try:
            self._connection.write(frame, now=final)  # the final frame goes before the child completes
        finally:
            if final:  # whatever became of the frame: Triton must see the child end (the relay then ends the stream)
                self._connection.release(self._stream)
                self._complete()
