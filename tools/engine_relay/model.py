"""tensorrt_llm_python (and tensorrt_llm_draft_python): the embedded engine's model behind the benchmark's relay
(tools/engine_relay, which installs this file as the model's model.py and the product's beside it as
embedded_model.py). The engine decides everything, as without the relay; only where its responses go differs: a
request the relay forwards comes with its relay parameters (bls.relay.frames.RelayedRequest), and its responses go to
the relay as frames (bls.triton_io.senders.RelayedSender), a round of them in one write, which the relay sends from
C++, a step's back to back, as TensorRT-LLM's C++ backend sends them. Cancellation is the relay's word, told to the
connection that claimed the stream.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

# The product's model and the library it ships sit in this folder (see embedded_model.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from embedded_model import TritonPythonModel as EmbeddedEngineModel

from bls.relay.connection import RelayConnections
from bls.relay.frames import RelayedRequest
from bls.response_loop import Transport
from bls.triton_io.lock import PB_LOCK
from bls.triton_io.requests import request_parameters
from bls.triton_io.senders import RelayedSender


class TritonPythonModel(EmbeddedEngineModel):
    def initialize(self, args: dict[str, Any]) -> None:
        self._relays = RelayConnections()  # before the engine starts: its sending rounds hold the connections
        super().initialize(args)

    def finalize(self) -> None:
        super().finalize()  # every stream's final frame is written before the connections close
        self._relays.close()

    def _sender(self, request: Any) -> tuple[Transport, Callable[[], bool]]:
        """The relay's stream: frames on the connection that claimed it; cancelled when the relay says the client
        has gone or a frame could not be written. A request that did not come through the relay (the model called by
        its own name) is answered through the stub, as without the relay."""
        with PB_LOCK:
            relayed = RelayedRequest.from_parameters(request_parameters(request))
        if relayed is None:
            return super()._sender(request)
        connection = self._relays.get(relayed.socket_name)
        relayed_sender = RelayedSender(request, self._name, relayed, connection)
        cancelled = threading.Event()
        try:
            connection.claim(relayed, cancelled.set)
        except OSError:  # nothing it sends can reach its client: it stops at the first check
            connection.release(relayed.stream)
            cancelled.set()
        return relayed_sender, lambda: relayed_sender.closed or cancelled.is_set()

    def _sending_round(self) -> AbstractContextManager[None]:
        """A round's frames go to the relay in one write (RelayConnections.corked)."""
        return self._relays.corked()
