"""bls.transports against the stand-in for `triton_python_backend_utils` of test_triton_io."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from bls.contract import BLS_MODEL, ModelContract, TensorSpec
from tests.unit.test_triton_io import Request, triton_io  # noqa: F401 - the fixture

CONTRACT = ModelContract(inputs=(TensorSpec("x", "TYPE_INT32", (1,)),), outputs=(TensorSpec("x", "TYPE_INT32", (1,)),))


@pytest.fixture
def transports(triton_io):  # noqa: F811 - the fixture imported above
    sys.modules.pop("bls.transports", None)
    import bls.transports as module

    yield module
    sys.modules.pop("bls.transports", None)


class Request2(Request):
    def request_id(self):
        return "client-id"


def test_in_process_serves_each_request_to_its_end_on_the_calling_thread(transports):
    transport = transports.InProcessTransport("m", CONTRACT)
    seen = []

    def serve(inputs, request_id, sink, arrived):
        seen.append((int(inputs["x"].item()), request_id, threading.get_ident()))
        sink.send({"x": inputs["x"]}, final=True)

    requests = [Request2({"x": np.array([[1]], np.int32)}), Request2({"x": np.array([[2]], np.int32)})]
    transport.execute(requests, serve)
    assert [value for value, _, _ in seen] == [1, 2], "one after another, in order"
    assert {thread for _, _, thread in seen} == {threading.get_ident()}
    assert all(rid.startswith("client-id-") for _, rid, _ in seen) and seen[0][1] != seen[1][1], "unique ids"
    for request in requests:
        assert [flags for _, flags in request.sender.sent] == [1], "one response, which ends the request"


def test_in_process_turns_a_failure_into_that_requests_error_and_ends_a_request_left_open(transports, triton_io):  # noqa: F811
    transport = transports.InProcessTransport("m", CONTRACT)

    def serve(inputs, request_id, sink, arrived):
        if int(inputs["x"].item()) == 1:
            raise triton_io.InvalidRequest("x", "is bad")

    bad, unfinished = Request2({"x": np.array([[1]], np.int32)}), Request2({"x": np.array([[2]], np.int32)})
    transport.execute([bad, unfinished], serve)
    (response, flags), = bad.sender.sent
    assert flags == 1 and "x: is bad" in response.error.message()
    assert [flags for _, flags in unfinished.sender.sent] == [1], "closed with the final flag"


def test_the_relay_transport_refuses_a_request_that_did_not_come_through_the_relay(transports):
    transport = transports.RelayTransport(BLS_MODEL, CONTRACT, workers=1, queued=1,
                                          merge=lambda a, b: None)
    request = Request2({"x": np.array([[1]], np.int32)})
    try:
        transport.execute([request], lambda *args: pytest.fail("served"))
    finally:
        transport.close(1.0)
    (response, flags), = request.sender.sent
    assert flags == 1 and "call tensorrt_llm_bls" in response.error.message()
