"""bls.relay.engine_streams against the relay's end of a real socket (tests.unit.test_relay_frames._RelayEnd): an engine
error keeps its Triton code as the one thing that classifies it, and unloading cancels every open engine call in
the relay, the one way an engine call is stopped."""

from __future__ import annotations

import struct
import threading

import pytest

from bls.errors import ErrorCode, GenerationCancelled, ModelStepError
from bls.relay.connection import RelayConnections
from bls.relay.engine_streams import RelayedEngineStreams
from bls.relay.frames import ENGINE_ERROR, engine_cancel_frame
from tests.unit.test_relay_frames import _RelayEnd


@pytest.fixture
def relay():
    end = _RelayEnd()
    connections = RelayConnections()
    connection = connections.get(end.name)
    # The connection opens with a claim, as the transport makes it before any engine call.
    connection.claim(end.relayed(1), lambda: None)
    end.accept()
    end.read(len(end.claim(1)))
    yield end, RelayedEngineStreams(lambda: connection)
    connections.close()
    end.close()


def _read_request(end) -> int:
    """The call number of the next engine request frame."""
    frame = end.read(struct.unpack("<I", end.read(4))[0])
    return struct.unpack_from("<Q", frame)[0]


def test_an_engine_error_is_classified_by_its_code_alone(relay):
    end, engines = relay
    failed = []

    def call():
        try:
            engines.stream_each("tensorrt_llm", {}, ["output_ids"], "r-0", lambda tensors: True)
        except ModelStepError as error:
            failed.append(error)

    worker = threading.Thread(target=call)
    worker.start()
    number = _read_request(end)
    message = b"input_ids: at capacity"  # words that once meant "unavailable" and "client": the code decides
    end.peer.sendall(struct.pack("<IQB", 9 + 4 + len(message), number, ENGINE_ERROR)
                     + struct.pack("<I", ErrorCode.NOT_FOUND) + message)
    worker.join(5)
    (error,) = failed
    assert error.code == ErrorCode.NOT_FOUND and error.client_code == ErrorCode.INTERNAL
    assert str(error) == "tensorrt_llm: input_ids: at capacity"


def test_unloading_cancels_every_open_engine_call_in_the_relay(relay):
    end, engines = relay
    outcomes = []

    def call(request_id):
        try:
            outcomes.append(engines.stream_each("tensorrt_llm", {}, ["output_ids"], request_id, lambda t: True))
        except GenerationCancelled as cancelled:
            outcomes.append(cancelled)

    workers = [threading.Thread(target=call, args=(f"r-{i}",)) for i in range(2)]
    for worker in workers:
        worker.start()
    numbers = sorted(_read_request(end) for _ in workers)
    engines.cancel_all()
    for worker in workers:
        worker.join(5)
    assert len(outcomes) == 2 and all(isinstance(outcome, GenerationCancelled) for outcome in outcomes)
    cancels = end.read(2 * len(engine_cancel_frame(0)))
    assert sorted([cancels[:13], cancels[13:]]) == sorted(engine_cancel_frame(n) for n in numbers)
