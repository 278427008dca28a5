"""bls.triton_io's modules against a small stand-in for `triton_python_backend_utils` (only available inside Triton)."""

from __future__ import annotations

import importlib
import sys
import threading
import time
import types

import numpy as np
import pytest

from bls.model_parameters import parse_positive_int


class _Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _TritonError(Exception):
    # The Python backend's codes are TRITONSERVER_Error_Code's values (pb_utils.TritonError.INVALID_ARG == 3).
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message, code=1):
        super().__init__(message)
        self._message, self._code = message, code

    def message(self):
        return self._message

    def code(self):
        return self._code


class _InferenceResponse:
    def __init__(self, output_tensors=(), error=None):
        self.output_tensors, self.error = list(output_tensors), error


class _Logger:
    errors: list[str] = []

    @classmethod
    def log_error(cls, message):
        cls.errors.append(message)


class _MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    created: list[str] = []

    def __init__(self, name, description, kind):
        _MetricFamily.created.append(name)

    def Metric(self, labels, buckets=None):  # pb_utils' name
        return _RecordedMetric()


class _RecordedMetric:
    """What the stub's metric was asked, in order."""

    def __init__(self):
        self.calls = []

    def increment(self, value):
        self.calls.append(("increment", value))

    def set(self, value):
        self.calls.append(("set", value))

    def observe(self, value):
        self.calls.append(("observe", value))


@pytest.fixture(scope="module")
def triton_io():
    stub = types.ModuleType("triton_python_backend_utils")
    stub.Tensor = _Tensor
    stub.TritonError = _TritonError
    stub.InferenceResponse = _InferenceResponse
    stub.Logger = _Logger
    stub.MetricFamily = _MetricFamily
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    stub.get_input_tensor_by_name = lambda request, name: request.tensors.get(name)
    sys.modules["triton_python_backend_utils"] = stub
    _forget_triton_io()
    namespace = types.SimpleNamespace(pb_utils=stub)
    for name in _MODULES:  # every public name of the package's modules, as the tests use them
        module = importlib.import_module(f"bls.triton_io.{name}")
        namespace.__dict__.update({key: value for key, value in vars(module).items() if not key.startswith("__")})
    namespace.pb_utils = stub
    yield namespace
    del sys.modules["triton_python_backend_utils"]
    _forget_triton_io()


_MODULES = ("lock", "requests", "responses", "senders", "children", "metrics")


def _forget_triton_io():
    """Drop the modules that imported the stand-in (or the real stub), so each test module imports them anew."""
    for name in [name for name in sys.modules if name.startswith("bls.triton_io")] + ["bls.transports"]:
        sys.modules.pop(name, None)


class RecordingSender:
    def __init__(self):
        self.sent = []
        self.sending = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.cancelled = False

    def send(self, response=None, flags=0):
        self.sending.set()
        self.release.wait(5)
        self.sent.append((response, flags))

    def is_cancelled(self):
        return self.cancelled


class Request:
    def __init__(self, tensors=None, parameters="{}", requested_outputs=("x", "text_output", "finish_reason")):
        self.tensors = {k: _Tensor(k, v) for k, v in (tensors or {}).items()}
        self.sender = RecordingSender()
        self._parameters = parameters
        self._requested_outputs = list(requested_outputs)

    def requested_output_names(self):
        return self._requested_outputs

    def parameters(self):
        return self._parameters

    def get_response_sender(self):
        return self.sender


def test_required_inputs_are_enforced_even_with_optional_ones_present(triton_io):
    from bls.contract import TENSORRT_LLM
    from bls.errors import InvalidRequest

    request = Request({"request_output_len": np.array([[4]], np.int32), "temperature": np.array([[1.0]], np.float32)})
    with pytest.raises(InvalidRequest) as error:
        triton_io.read_inputs(request, TENSORRT_LLM)
    assert error.value.field == "input_lengths"  # required in 1.2.1 (input_ids became optional there)


def test_the_stream_ends_exactly_once(triton_io):
    request = Request()
    sender = triton_io.StubSender(request, "m")
    sender.send({"x": np.zeros(1)})
    sender.send({"x": np.zeros(1)}, final=True)
    sender.send_error(RuntimeError("late"))  # after FINAL: dropped, never a second end
    sender.finish()
    assert [flags for _, flags in request.sender.sent] == [0, 1]


def test_a_relayed_stream_finished_without_outputs_ends_with_a_final_frame(triton_io):
    """finish() (the embedded engine's answer to a `stop` request, behind its relay) writes a final frame that only
    closes the stream, then completes the child request: a child completed without one would be a relay error."""
    from bls.relay.connection import RelayConnections
    from bls.relay.frames import encode_tensors, response_frame
    from tests.unit.test_relay_frames import _RelayEnd

    relay_end = _RelayEnd()
    connections = RelayConnections()
    try:
        request = Request()
        connection = connections.get(relay_end.name)
        sender = triton_io.RelayedSender(request, "m", relay_end.relayed(4), connection)
        connection.claim(relay_end.relayed(4), lambda: None)  # as the transport does: this connects
        relay_end.accept()
        sender.finish()
        sender.finish()  # closed: nothing more
        expected = relay_end.claim(4) + response_frame(4, encode_tensors({}), final=True)
        assert relay_end.read(len(expected)) == expected
        assert request.sender.sent == [(None, 1)]
    finally:
        connections.close()
        relay_end.close()


def test_errors_name_the_field_and_hide_tracebacks(triton_io):
    from bls.errors import InvalidRequest

    sender = triton_io.StubSender(request := Request(), "preprocessing")
    sender.send_error(InvalidRequest("MESSAGES", "is not valid JSON"))
    ((response, flags),) = request.sender.sent
    assert response.error.code() == _TritonError.INVALID_ARG
    assert flags == 1  # the error ends the stream (apart from it, Triton 2.51's ensemble leaked the request)
    assert response.error.message() == "MESSAGES: is not valid JSON"

    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError as error:
        caught = error
    internal = triton_io.error_response(caught, "preprocessing")  # outside the except, as engine events are
    assert internal.error.code() == _TritonError.INTERNAL and "Traceback" not in internal.error.message()
    assert "Traceback" in _Logger.errors[-1]  # the traceback goes to the server log


def test_is_cancelled_never_waits_for_a_send(triton_io):
    request = Request()
    request.sender.release.clear()
    sender = triton_io.StubSender(request, "m")
    sending = threading.Thread(target=sender.send, args=({"x": np.zeros(1)},))
    sending.start()
    assert request.sender.sending.wait(5)
    answered = threading.Event()
    threading.Thread(target=lambda: (sender.is_cancelled(), answered.set())).start()
    assert answered.wait(2), "is_cancelled blocked behind a send in progress"
    request.sender.release.set()
    sending.join(5)


def test_only_requested_outputs_are_handed_to_the_stub(triton_io):
    """The stub drops the others with the GIL released, freeing Python objects without it (a libpython
    segfault under load): the sender leaves them out itself."""
    request = Request(requested_outputs=["text_output"])
    sender = triton_io.StubSender(request, "m")
    sender.send({"text_output": np.array([b"hi"], dtype=object), "finish_reason": np.array([b"stop"], dtype=object),
                 "num_output_tokens": np.array([[1]], np.int32)}, final=True)
    (response, flags), = request.sender.sent
    assert [tensor.name() for tensor in response.output_tensors] == ["text_output"] and flags == 1


def test_metric_families_are_created_once_and_kept(triton_io):
    metrics = triton_io.Metrics()
    before = len(_MetricFamily.created)
    ok = metrics.counter("llm_requests_total", "d", {"reason": "ok"})
    metrics.counter("llm_requests_total", "d", {"reason": "error"})
    assert len(_MetricFamily.created) == before + 1
    del metrics
    ok.increment()  # the family outlives the Metrics object that made it


def test_closed_metrics_release_their_families_and_ignore_updates(triton_io):
    import gc
    import weakref

    metrics = triton_io.Metrics()
    tokens = metrics.counter("llm_tokens_total", "d", {})
    family = weakref.ref(tokens._family)
    metrics.close()
    gc.collect()
    assert family() is None  # released in finalize, not left to the stub's exit
    tokens.increment()  # an update racing the unload is dropped, not an error


def test_metric_updates_reach_triton_once_per_flush_not_per_update(triton_io):
    """Each pb_utils metric call is a round trip to tritonserver: the engine's per-token counts are summed
    in the process and handed over every FLUSH_S, observations with them; close() hands over what is pending."""
    metrics = triton_io.Metrics()
    tokens = metrics.counter("llm_tokens_total", "d", {})
    active = metrics.gauge("llm_active", "d", {})
    first_token = metrics.histogram("llm_first_token_seconds", "d", {}, [0.1, 1.0])
    stub_tokens, stub_active, stub_first = (m._metric for m in (tokens, active, first_token))
    for _ in range(1000):
        tokens.increment()
    active.set(3)
    active.set(2)
    first_token.observe(0.05)
    first_token.observe(0.5)
    assert stub_first.calls == []  # the observer's thread never makes the round trip itself
    deadline = time.monotonic() + 5
    while not stub_tokens.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(3 * triton_io.Metrics.FLUSH_S)
    assert stub_tokens.calls == [("increment", 1000)] and stub_active.calls == [("set", 2)]
    assert stub_first.calls == [("observe", 0.05), ("observe", 0.5)]
    tokens.increment(5)
    metrics.close()
    assert stub_tokens.calls == [("increment", 1000), ("increment", 5)]


def test_before_flush_hooks_set_values_once_per_hand_over(triton_io):
    """A value that changes every engine iteration is set by a hook at each hand-over, from the latest state: the
    stub sees the last value once per flush, and close() hands over the final one."""
    metrics = triton_io.Metrics(flush_thread=False)
    active = metrics.gauge("llm_active", "d", {})
    latest = {"active": 0}
    metrics.before_flush(lambda: active.set(latest["active"]))
    for value in range(1, 100):
        latest["active"] = value
    time.sleep(triton_io.Metrics.FLUSH_S)
    metrics.flush_due()
    assert active._metric.calls == [("set", 99)]
    stub_active = active._metric
    latest["active"] = 0
    metrics.close()
    assert stub_active.calls == [("set", 99), ("set", 0)]


def test_request_parameters_are_refused_by_name(triton_io):
    """generate turns unknown JSON fields into parameters: each must be an error naming it, not a no-op."""
    from bls.contract import POSTPROCESSING
    from bls.errors import InvalidRequest

    tensors = {"TOKENS_BATCH": np.zeros((1, 1, 1), np.int32), "SEQUENCE_LENGTH": np.ones((1, 1), np.int32)}
    with pytest.raises(InvalidRequest) as error:
        triton_io.read_inputs(Request(tensors, parameters='{"seeed": 3}'), POSTPROCESSING)
    assert error.value.field == "seeed" and "not an input" in error.value.problem
    # Triton's own request parameters (tritonclient's empty-final-response flag) are not the model's.
    assert set(triton_io.read_inputs(Request(tensors, '{"triton_enable_empty_final_response": true}'),
                                     POSTPROCESSING)) == set(tensors)


def test_whole_number_parameters_are_checked_by_name():
    assert parse_positive_int(None, 1, "stream_interval") == 1
    assert parse_positive_int("4", 1, "stream_interval") == 4
    for bad in ("0", "-2", "four", "1.5"):
        with pytest.raises(ValueError, match=f"stream_interval={bad!r} is not a whole number"):
            parse_positive_int(bad, 1, "stream_interval")


class _ChildResponse:
    def __init__(self, tensors=None, error=None):
        self.tensors, self._error = tensors or {}, error

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


@pytest.fixture
def children(triton_io, monkeypatch):
    """The stub's BLS calls: each request recorded, answered by `answer(model, inputs)`."""
    calls = []

    class InferenceRequest:
        def __init__(self, model_name, inputs, requested_output_names, request_id=""):
            self.model_name, self.request_id = model_name, request_id
            self.inputs = {tensor.name(): tensor.as_numpy() for tensor in inputs}

        def exec(self, decoupled=False):
            assert not decoupled, "streams never go through exec here (bls.triton_io.children)"
            calls.append((self.model_name, self.request_id))
            if self.model_name == "broken":
                return _ChildResponse(error=_TritonError("engine: at capacity", _TritonError.UNAVAILABLE))
            return _ChildResponse({"OUTPUT": np.array([b"x"], dtype=object)})

    monkeypatch.setattr(triton_io.pb_utils, "InferenceRequest", InferenceRequest, raising=False)
    monkeypatch.setattr(triton_io.pb_utils, "get_output_tensor_by_name",
                        lambda response, name: _Tensor(name, response.tensors[name]) if name in response.tensors
                        else None, raising=False)
    return calls


def test_unary_engines_answer_once_with_a_plain_exec(triton_io, children):
    models = triton_io.InProcessModels()
    assert list(models.stream("post", {"TOKENS_BATCH": np.array([[[1]]], np.int32)}, ["OUTPUT"], "r")) == [
        {"OUTPUT": np.array([b"x"], dtype=object)}]
    assert children == [("post", "r")]


def test_a_child_error_keeps_its_triton_code_and_the_client_gets_it_by_code(triton_io, children):
    """Classified by code alone: the message's words never decide (bls.errors.ModelStepError.client_code)."""
    from bls.errors import ErrorCode, ModelStepError

    with pytest.raises(ModelStepError) as caught:
        triton_io.InProcessModels().infer("broken", {"x": np.zeros(1)}, ["OUTPUT"], "r")
    assert caught.value.code == ErrorCode.UNAVAILABLE
    assert triton_io.error_status(caught.value, "m") == (ErrorCode.UNAVAILABLE, "broken: engine: at capacity")
    for code, client in ((ErrorCode.INVALID_ARG, ErrorCode.INVALID_ARG), (ErrorCode.UNSUPPORTED, ErrorCode.UNSUPPORTED),
                         (ErrorCode.NOT_FOUND, ErrorCode.INTERNAL), (ErrorCode.CANCELLED, ErrorCode.INTERNAL),
                         (99, ErrorCode.INTERNAL)):
        assert triton_io.error_status(ModelStepError("engine", "input_ids: at capacity", code), "m")[0] == client
