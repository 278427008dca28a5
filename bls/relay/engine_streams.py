"""The BLS's engine streams through the relay (relay/, bls.relay.connection): the relay transport's half of ModelCaller.

The relay sends each engine request in-process (TRITONSERVER_ServerInferAsync) and writes every response back
on this process's connection, where its reader thread hands them on, a burst at a time. Errors keep Triton's
code (bls.errors.ModelStepError.code), which alone classifies them. A stream is registered under its request id so
that cancel() ends it at once from another thread (the client has gone): its reader then gets GenerationCancelled,
and the relay cancels the engine request (TRITONSERVER_InferenceRequestCancel): the one way an engine call is
stopped, whoever stops it (a client gone, a reader leaving early, unloading).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np

from bls.errors import ErrorCode, GenerationCancelled, ModelStepError
from bls.relay.connection import EngineCallError, RelayConnection, RelayDisconnected, RelayEngineCall

Tensors = dict[str, np.ndarray]

class RelayedEngineStreams:
    """Engine streams of every thread of the process, over its one relay connection."""

    def __init__(self, connection: Callable[[], RelayConnection]):
        """`connection()`: the process's connection to the relay (it becomes known with the first relayed
        request, before any engine call)."""
        self._connection = connection
        self._lock = threading.Lock()
        # Open calls: their request ids, keyed by call (a `stop` request reuses its child's id).
        self._open: dict[RelayEngineCall, str] = {}
        self._cancelled: set[RelayEngineCall] = set()

    def cancel(self, request_id: str) -> None:
        """Cancel, from any thread, the open streams of `request_id` and of its children (ids "`request_id`-...")."""
        with self._lock:
            calls = [call for call, rid in self._open.items() if rid == request_id or rid.startswith(f"{request_id}-")]
            self._cancelled.update(calls)
        for call in calls:
            call.stop()

    def cancel_all(self) -> None:
        """Cancel every open stream (unloading): no engine keeps generating for nobody."""
        with self._lock:
            calls = list(self._open)
            self._cancelled.update(calls)
        for call in calls:
            call.stop()

    def stream_each(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_response: Callable[[Tensors], bool]) -> bool:
        """`on_response` for each response, on the connection's reader thread (it must not block); returns when
        the stream ends: True when read to its end, False when on_response returned False (the relay cancels the
        engine request)."""
        with self._call(model_name, inputs, frozenset(outputs), request_id) as open_call:
            return open_call(on_response).wait()

    def stream(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
               request_id: str = "") -> Iterator[Tensors]:
        """The responses of one request, read on the caller's thread; closing the iterator early cancels it."""
        events: queue.SimpleQueue = queue.SimpleQueue()  # None: the stream has ended
        with self._call(model_name, inputs, frozenset(outputs), request_id) as open_call:
            call = open_call(lambda response: events.put(response) or True, on_end=lambda: events.put(None))
            while (response := events.get()) is not None:
                yield response
            call.wait()  # raises how it ended

    @contextmanager
    def _call(self, model_name: str, inputs: Mapping[str, np.ndarray], wanted: frozenset[str], request_id: str):
        """Gives a function that opens the engine call, registered for cancel(); maps how it ended to our errors,
        and stops it (the relay cancels the engine request) when the caller leaves before its end."""
        opened: list[RelayEngineCall] = []

        def register(call: RelayEngineCall) -> None:
            opened.append(call)
            with self._lock:
                self._open[call] = request_id

        def open_call(on_response: Callable[[Tensors], bool],
                      on_end: Callable[[], None] | None = None) -> RelayEngineCall:
            def on_event(found: Tensors) -> bool:
                # A decoupled engine may end with an empty final response: nothing to hand on.
                tensors = {name: value for name, value in found.items() if name in wanted}
                return on_response(tensors) if tensors else True

            return self._connection().call_engine(model_name, inputs, wanted, request_id, on_event, on_end,
                                                  register)

        try:
            yield open_call
        except EngineCallError as error:
            raise ModelStepError(model_name, str(error), error.code) from None
        except RelayDisconnected as error:
            with self._lock:
                cancelled = any(call in self._cancelled for call in opened)
            if cancelled:
                raise GenerationCancelled(request_id) from None
            raise ModelStepError(model_name, f"lost the relay ({error})", ErrorCode.UNAVAILABLE) from None
        finally:
            for call in opened:
                call.stop()  # no-op once it has ended
                with self._lock:
                    self._open.pop(call, None)
                    self._cancelled.discard(call)
