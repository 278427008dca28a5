"""bls.triton_io against a small stand-in for `triton_python_backend_utils` (only available inside Triton)."""

from __future__ import annotations

import sys
import threading
import time
import types

import numpy as np
import pytest


class _Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _TritonError(Exception):
    INVALID_ARG, INTERNAL, UNSUPPORTED, UNAVAILABLE = "INVALID_ARG", "INTERNAL", "UNSUPPORTED", "UNAVAILABLE"

    def __init__(self, message, code="INTERNAL"):
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
    sys.modules.pop("bls.triton_io", None)
    import bls.triton_io as module

    yield module
    del sys.modules["triton_python_backend_utils"]
    sys.modules.pop("bls.triton_io", None)


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
    sender = triton_io.SafeSender(request, "m")
    sender.send({"x": np.zeros(1)})
    sender.send({"x": np.zeros(1)}, final=True)
    sender.send_error(RuntimeError("late"))  # after FINAL: dropped, never a second end
    sender.finish()
    assert [flags for _, flags in request.sender.sent] == [0, 1]


def test_a_relayed_stream_finished_without_outputs_ends_with_a_final_frame(triton_io):
    """finish() (the embedded engine's answer to a `stop` request, behind its relay) writes a final frame that only
    closes the stream, then completes the child request: a child completed without one would be a relay error."""
    from bls.relay import RelayConnections, encode_tensors, response_frame
    from tests.unit.test_relay_frames import _RelayEnd

    relay_end = _RelayEnd()
    connections = RelayConnections()
    try:
        request = Request()
        sender = triton_io.RelayedSender(request, "m", relay_end.relayed(4), connections.get(relay_end.name))
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

    sender = triton_io.SafeSender(request := Request(), "preprocessing")
    sender.send_error(InvalidRequest("MESSAGES", "is not valid JSON"))
    ((response, flags),) = request.sender.sent
    assert response.error.code() == "INVALID_ARG"
    assert flags == 1  # the error ends the stream (apart from it, Triton 2.51's ensemble leaked the request)
    assert response.error.message() == "MESSAGES: is not valid JSON"

    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError as error:
        caught = error
    internal = triton_io.error_response(caught, "preprocessing")  # outside the except, as engine events are
    assert internal.error.code() == "INTERNAL" and "Traceback" not in internal.error.message()
    assert "Traceback" in _Logger.errors[-1]  # the traceback goes to the server log


def test_is_cancelled_never_waits_for_a_send(triton_io):
    request = Request()
    request.sender.release.clear()
    sender = triton_io.SafeSender(request, "m")
    sending = threading.Thread(target=sender.send, args=({"x": np.zeros(1)},))
    sending.start()
    assert request.sender.sending.wait(5)
    answered = threading.Event()
    threading.Thread(target=lambda: (sender.is_cancelled(), answered.set())).start()
    assert answered.wait(2), "is_cancelled blocked behind a send in progress"
    request.sender.release.set()
    sending.join(5)


def test_is_cancelled_with_wait_asks_even_while_a_send_is_in_progress(triton_io):
    """The BLS's sending threads ask so: an answer from an earlier check kept gone clients' engines running."""
    request = Request()
    request.sender.release.clear()
    sender = triton_io.SafeSender(request, "m")
    assert not sender.is_cancelled()
    sending = threading.Thread(target=sender.send, args=({"x": np.zeros(1)},))
    sending.start()
    assert request.sender.sending.wait(5)
    request.sender.cancelled = True
    assert not sender.is_cancelled(), "without wait: the previous answer while the send holds the stub"
    answer = []
    asking = threading.Thread(target=lambda: answer.append(sender.is_cancelled(wait=True)))
    asking.start()
    request.sender.release.set()
    asking.join(5)
    sending.join(5)
    assert answer == [True]


def test_only_requested_outputs_are_handed_to_the_stub(triton_io):
    """The stub drops the others with the GIL released, freeing Python objects without it (a libpython
    segfault under load): the sender leaves them out itself."""
    request = Request(requested_outputs=["text_output"])
    sender = triton_io.SafeSender(request, "m")
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


def test_whole_number_parameters_are_checked_by_name(triton_io):
    assert triton_io.parse_positive_int(None, 1, "stream_interval") == 1
    assert triton_io.parse_positive_int("4", 1, "stream_interval") == 4
    for bad in ("0", "-2", "four", "1.5"):
        with pytest.raises(ValueError, match=f"stream_interval={bad!r} is not a whole number"):
            triton_io.parse_positive_int(bad, 1, "stream_interval")


class _ChildResponse:
    def __init__(self, tensors=None, error=None):
        self.tensors, self._error = tensors or {}, error

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class _ScriptedChildren:
    """The stub's BLS calls: each request is recorded; a streamed one yields `script` responses lazily."""

    def __init__(self, script):
        self.script = script
        self.requests = []  # (model, inputs, request_id, decoupled)
        self.read = []  # responses read, per stream, in order

    def request_class(self):
        children = self

        class InferenceRequest:
            def __init__(self, model_name, inputs, requested_output_names, request_id=""):
                self.model_name, self.request_id = model_name, request_id
                self.inputs = {tensor.name(): tensor.as_numpy() for tensor in inputs}

            def exec(self, decoupled=False):
                children.requests.append((self.model_name, self.inputs, self.request_id, decoupled))
                if "stop" in self.inputs:
                    return iter([_ChildResponse()]) if decoupled else _ChildResponse()
                if not decoupled:
                    return _ChildResponse({"OUTPUT": np.array([b"x"], dtype=object)})
                read = []
                children.read.append(read)

                def responses():
                    for tokens in children.script:
                        read.append(tokens)
                        yield _ChildResponse({"output_ids": np.array([[tokens]], np.int32)})
                return responses()

        return InferenceRequest


@pytest.fixture
def children(triton_io, monkeypatch):
    scripted = _ScriptedChildren([[1], [2], [3], [4]])
    monkeypatch.setattr(triton_io.pb_utils, "InferenceRequest", scripted.request_class(), raising=False)
    monkeypatch.setattr(triton_io.pb_utils, "get_output_tensor_by_name",
                        lambda response, name: _Tensor(name, response.tensors[name]) if name in response.tensors
                        else None, raising=False)
    return scripted


def test_in_process_streams_read_every_engine_response_in_order(triton_io, children):
    models = triton_io.InProcessModels(decoupled_engines=True)
    seen = []
    assert models.stream_each("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "r-0",
                              lambda tensors: seen.append(tensors["output_ids"].item()) or True)
    assert seen == [1, 2, 3, 4]
    assert children.requests == [("engine", children.requests[0][1], "r-0", True)]


def test_leaving_an_in_process_stream_early_stops_the_engine_request_once_then_reads_what_is_left(triton_io, children):
    models = triton_io.InProcessModels(decoupled_engines=True)
    assert not models.stream_each("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "r-0",
                                  lambda tensors: tensors["output_ids"].item() < 2)
    stops = [(model, rid) for model, inputs, rid, _ in children.requests if "stop" in inputs]
    assert stops == [("engine", "r-0")], "a stop request with the child's id"
    assert children.read[0] == [[1], [2], [3], [4]], "the iterator is read to its end, never dropped unread"
    models.stop("engine", "r-0")  # the generator's own stop after a cancelled stream: already done
    assert len([1 for _, inputs, _, _ in children.requests if "stop" in inputs]) == 1
    models.stop("engine", "r-1")  # a generation that was not left early: stopped now
    assert [rid for _, inputs, rid, _ in children.requests if "stop" in inputs] == ["r-0", "r-1"]


def test_in_process_streams_refuse_a_second_reading_thread(triton_io, children):
    """exec(decoupled=True) from two threads of one stub can deadlock it (InProcessModels' docstring)."""
    models = triton_io.InProcessModels(decoupled_engines=True)
    list(models.stream("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "a"))
    errors = []

    def other_thread():
        try:
            list(models.stream("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "b"))
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(5)
    assert errors and "second thread" in str(errors[0])


def test_non_decoupled_engines_answer_once_with_a_plain_exec(triton_io, children):
    models = triton_io.InProcessModels(decoupled_engines=False)
    assert list(models.stream("post", {"TOKENS_BATCH": np.array([[[1]]], np.int32)}, ["OUTPUT"], "r")) == [
        {"OUTPUT": np.array([b"x"], dtype=object)}]
    assert [decoupled for *_, decoupled in children.requests] == [False]


def test_read_iterators_are_dropped_on_the_streaming_thread_only_after_the_keep_time(triton_io, children, monkeypatch):
    """The stub's cleanup thread must never hold the last reference to a response iterator (it drops it without the
    GIL): ours is kept ITERATOR_KEEP_S, then dropped by the thread that streams."""
    import gc
    import weakref

    models = triton_io.InProcessModels(decoupled_engines=True)
    iterators = []
    real = children.request_class()

    class Recording(real):
        def exec(self, decoupled=False):
            result = super().exec(decoupled)
            if decoupled:
                iterators.append(weakref.ref(result))
            return result

    monkeypatch.setattr(triton_io.pb_utils, "InferenceRequest", Recording)
    list(models.stream("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "a"))
    gc.collect()
    assert iterators[0]() is not None, "kept after it was read"
    monkeypatch.setattr(models, "ITERATOR_KEEP_S", 0.0)
    time.sleep(0.01)
    list(models.stream("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "b"))
    gc.collect()
    assert iterators[0]() is None, "dropped by the next stream once the keep time has passed"


def test_kept_iterators_are_dropped_at_unload(triton_io, children):
    import gc
    import weakref

    models = triton_io.InProcessModels(decoupled_engines=True)
    list(models.stream("engine", {"input_ids": np.array([[5]], np.int32)}, ["output_ids"], "a"))
    kept = [weakref.ref(iterator) for _, iterator in models._read_iterators]
    models.release_read_iterators()
    gc.collect()
    assert kept and all(ref() is None for ref in kept)
