"""bls.response_loop, the one sending loop of the BLS and the embedded engine: sending threads, streams merged
while they wait (merge_streamed) or sent one response per round, first responses first, rounds corked, held while a
paced engine steps, the engine's backlog bound; a thread that sends what it queues itself (send_waiting). The
engine's streams are driven as its model drives them: engine events shaped by embedded_engine.responses."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from bls.response_loop import ResponseLoop, merge_streamed
from embedded_engine.request import GenerationRequest
from embedded_engine.responses import TritonRequestStream, merge_responses
from embedded_engine.sampling import SamplingParams
from embedded_engine.scheduler import EngineEvent


def text(value: str) -> dict:
    return {"text": np.array([value.encode()], dtype=object)}


def join_texts(earlier: dict, later: dict) -> dict | None:
    if "stop_merging" in later:
        return None
    return {"text": np.array([earlier["text"][0] + later["text"][0]], dtype=object)}


class Transport:
    """Records what the loop sends; `gate` (when cleared) holds every send until it is set."""

    def __init__(self, name: str, log: list, gate: threading.Event | None = None, fail_at: int | None = None):
        self.name, self.log, self.gate, self.fail_at = name, log, gate, fail_at
        self.sending = threading.Event()
        self.done = threading.Event()
        self.senders: list[str] = []  # the thread of each send
        self.order: list[tuple[str, str, str]] = []  # ("build" or "send", stream, text), as they happened

    def build(self, outputs):
        if "unbuildable" in outputs:
            raise ValueError("a tensor the stub cannot take")
        self.order.append(("build", self.name, outputs["text"][0].decode()))
        return {**outputs, "prebuilt": True}

    def send_built(self, response, final=False):
        assert response.pop("prebuilt")
        self.send(response, final)

    def send(self, outputs, final=False):
        if "unbuildable" in outputs:
            raise ValueError("a tensor the stub cannot take")
        self.order.append(("send", self.name, outputs["text"][0].decode() if "text" in outputs else ""))
        self.sending.set()
        if self.gate is not None:
            assert self.gate.wait(5)
        if self.fail_at is not None and len([e for e in self.log if e[0] == self.name]) == self.fail_at:
            raise RuntimeError("the client's connection broke")
        self.log.append((self.name, outputs["text"][0].decode() if "text" in outputs else "", final))
        self.senders.append(threading.current_thread().name)
        if final:
            self.done.set()

    def send_error(self, error):
        self.log.append((self.name, f"error: {error}", True))
        self.done.set()


@pytest.fixture()
def loop():
    loop = ResponseLoop()
    yield loop
    loop.close(5)


def test_responses_go_out_in_order_and_the_stream_ends_once(loop):
    log = []
    transport = Transport("a", log)
    stream = loop.open(transport, join_texts)
    for piece in ("x", "y"):
        stream.send(text(piece))
    stream.send(text("end"), final=True)
    stream.send(text("late"))
    stream.send_error(RuntimeError("late"))
    assert stream.closed and transport.done.wait(5)
    assert loop.close(5)
    assert "".join(t for _, t, _ in log) == "xyend" and log[-1][2] and [f for *_, f in log].count(True) == 1


def test_responses_waiting_behind_a_send_are_merged(loop):
    log, gate = [], threading.Event()
    transport = Transport("a", log, gate)
    stream = loop.open(transport, join_texts)
    stream.send(text("0"))
    assert transport.sending.wait(5)  # the loop is inside the first send now
    for index in range(1, 10):
        stream.send(text(str(index)))
    assert loop.waiting() == 1, "the nine later responses wait as one"
    stream.send(text("!"), final=True)  # the final response is never merged
    gate.set()
    assert transport.done.wait(5)
    assert log == [("a", "0", False), ("a", "123456789", False), ("a", "!", True)]


def test_responses_that_cannot_merge_go_apart(loop):
    log, gate = [], threading.Event()
    transport = Transport("a", log, gate)
    stream = loop.open(transport, join_texts)
    stream.send(text("0"))
    assert transport.sending.wait(5)
    stream.send(text("1"))
    stream.send(text("2") | {"stop_merging": np.zeros(1)})
    stream.send(text("3"), final=True)
    gate.set()
    assert transport.done.wait(5)
    assert [t for _, t, _ in log] == ["0", "1", "2", "3"]


def test_a_new_stream_is_served_before_running_ones(loop):
    log, gate = [], threading.Event()
    running_transport = Transport("running", log, gate)
    running = loop.open(running_transport, join_texts)
    running.send(text("r0"))
    assert running_transport.sending.wait(5)  # the loop is inside r0's send
    running.send(text("r1"))
    new = loop.open(Transport("new", log, gate), join_texts)
    new.send(text("n0"))
    running.send(text("end"), final=True)
    new.send(text("end"), final=True)
    gate.set()
    assert running_transport.done.wait(5)
    assert [t for name, t, _ in log if t != "end"] == ["r0", "n0", "r1"], "a first token must not wait behind r1"


def test_a_failed_send_ends_that_stream_only(loop):
    log = []
    broken = Transport("broken", log, fail_at=1)
    healthy = Transport("healthy", log)
    stream = loop.open(broken, join_texts)
    other = loop.open(healthy, join_texts)
    stream.send(text("a"))
    while not log:
        threading.Event().wait(0.01)
    stream.send(text("b"))  # fails
    assert broken.done.wait(5)
    assert stream.is_cancelled(), "the producer must learn that its stream is gone (and stop its engine)"
    assert log[-1] == ("broken", "error: the client's connection broke", True)
    other.send(text("still served"), final=True)
    assert healthy.done.wait(5)


def test_after_a_cancellation_only_the_final_response_goes():
    loop = ResponseLoop()
    try:
        log, gate = [], threading.Event()
        transport = Transport("a", log, gate)
        stream = loop.open(transport, join_texts)
        stream.send(text("a"))
        assert transport.sending.wait(5)  # "a" goes out alone; the client leaves while it is sent
        stream.cancel()  # the relay's word, on the connection's reader thread
        for _ in range(100):
            stream.send(text("b"))
        stream.send(text("end"), final=True)
        gate.set()
        assert transport.done.wait(5)
        assert stream.is_cancelled()
        assert log == [("a", "a", False), ("a", "end", True)], \
            "nothing but the final response after a cancellation, and that one still goes"
    finally:
        loop.close(5)


def test_several_sending_threads_keep_each_stream_in_order():
    loop = ResponseLoop(threads=4)
    try:
        log = []
        transports = [Transport(f"s{i}", log) for i in range(16)]
        streams = [loop.open(transport, join_texts) for transport in transports]
        for index in range(200):
            for stream in streams:
                stream.send(text(f"{index},"))
        for stream in streams:
            stream.send(text("end"), final=True)
        assert all(transport.done.wait(5) for transport in transports)
        for transport in transports:
            sent = [entry for entry in log if entry[0] == transport.name]
            assert "".join(entry[1] for entry in sent) == "".join(f"{i}," for i in range(200)) + "end"
            assert [entry[2] for entry in sent].count(True) == 1 and sent[-1][2]
    finally:
        assert loop.close(5)


def test_the_sending_threads_send_side_by_side():
    """Streams queued together are shared among the loop's threads (each takes its share of a round and wakes
    another for the rest), not sent by the first thread that wakes: with every send held at a gate, all four threads
    are inside a send at once."""
    loop = ResponseLoop(threads=4)
    gate = threading.Event()
    try:
        log = []
        transports = [Transport(f"s{i}", log, gate) for i in range(8)]
        streams = [loop.open(transport, join_texts) for transport in transports]
        for stream in streams:
            stream.send(text("a"), final=True)
        deadline = time.monotonic() + 5
        while sum(transport.sending.is_set() for transport in transports) < 4:
            assert time.monotonic() < deadline, [transport.sending.is_set() for transport in transports]
            time.sleep(0.01)
        gate.set()
        assert all(transport.done.wait(5) for transport in transports)
        assert len({sender for transport in transports for sender in transport.senders}) == 4
    finally:
        gate.set()
        assert loop.close(5)


def test_close_sends_what_waits():
    loop = ResponseLoop()
    log, gate = [], threading.Event()
    transport = Transport("a", log, gate)
    stream = loop.open(transport, join_texts)
    stream.send(text("0"))
    assert transport.sending.wait(5)
    stream.send(text("1"), final=True)
    closing = threading.Thread(target=loop.close, args=(5,))
    closing.start()
    gate.set()
    closing.join(5)
    assert log == [("a", "0", False), ("a", "1", True)]


def test_a_gone_client_interrupts_its_producer_once_on_a_sending_thread():
    """when_cancelled: the producer may be waiting for its engine's next response; cancel() (called with the relay
    connection's lock held) only takes note, and a sending thread runs the callback at once."""
    loop = ResponseLoop()
    try:
        transport = Transport("a", [])
        stream = loop.open(transport, join_texts)
        interrupted = threading.Event()
        threads = []
        stream.when_cancelled(lambda: (threads.append(threading.current_thread().name), interrupted.set()))
        stream.cancel()
        stream.cancel()  # told twice (a broken connection after the cancel frame): interrupted once
        assert interrupted.wait(5)
        stream.send(text("end"), final=True)
        assert transport.done.wait(5)
        assert threads == ["bls-send-0"], "called once, on the loop's thread"
        late = []
        stream.when_cancelled(lambda: late.append("now"))
        assert late == ["now"], "a callback registered after the cancellation runs at once"
    finally:
        loop.close(5)


def on_thread(name: str, work) -> None:
    thread = threading.Thread(target=work, name=name)
    thread.start()
    thread.join(5)
    assert not thread.is_alive()


def test_a_thread_that_sends_for_itself_wakes_no_sending_thread(loop):
    """The engine stream reader's way: queue a sweep's responses, then send_waiting() on the same thread."""
    log = []
    first, second = Transport("first", log), Transport("second", log)
    streams = {}

    def sweep():
        loop.send_waiting()  # nothing waits yet; from now on this thread sends what it queues
        streams["first"] = loop.open(first, join_texts)
        streams["second"] = loop.open(second, join_texts)
        for piece in ("a", "b"):
            streams["first"].send(text(piece))
        streams["second"].send(text("c"))
        threading.Event().wait(0.2)  # a sending thread woken by these sends would have taken them by now
        assert log == []
        loop.send_waiting()

    on_thread("reader", sweep)
    assert log == [("first", "ab", False), ("second", "c", False)], "merged while waiting, in the order queued"
    assert first.senders == second.senders == ["reader"]
    streams["first"].send(text("end"), final=True)  # from a thread that does not send for itself
    assert first.done.wait(5)
    assert first.senders[-1] == "bls-send-0"


def test_what_another_thread_queues_during_a_self_sending_threads_send_still_goes_out(loop):
    log, gate = [], threading.Event()
    transport = Transport("a", log, gate)
    stream = loop.open(transport, join_texts)

    def sweep():
        loop.send_waiting()
        stream.send(text("0"))
        loop.send_waiting()  # held in the send of "0" until the gate opens

    reader = threading.Thread(target=sweep, name="reader")
    reader.start()
    assert transport.sending.wait(5)
    stream.send(text("1"), final=True)  # this thread sends nothing itself: a sending thread must
    gate.set()
    reader.join(5)
    assert transport.done.wait(5)
    assert log == [("a", "0", False), ("a", "1", True)] and transport.senders == ["reader", "bls-send-0"]


def test_a_self_sending_thread_builds_every_response_of_its_round_before_the_first_send(loop):
    """A send is a round trip to tritonserver that leaves the CPU's caches cold: builds run back to back first."""
    order: list = []
    transports = [Transport(name, []) for name in ("a", "b", "c")]
    for transport in transports:
        transport.order = order

    def sweep():
        loop.send_waiting()
        streams = [loop.open(transport, join_texts) for transport in transports]
        for stream, transport in zip(streams, transports, strict=True):
            stream.send(text(transport.name + "1"))
        loop.send_waiting()
        for stream in streams:
            stream.send(text("end"), final=True)
        loop.send_waiting()

    on_thread("reader", sweep)
    assert all(transport.done.wait(5) for transport in transports)
    first_round = order[:6]
    assert [kind for kind, *_ in first_round] == ["build"] * 3 + ["send"] * 3
    assert [text for *_, text in first_round] == ["a1", "b1", "c1"] * 2
    assert all(transport.senders == ["reader", "reader"] for transport in transports)


def test_a_response_that_cannot_be_built_ends_its_stream_only(loop):
    log: list = []
    bad, good = Transport("bad", log), Transport("good", log)

    def sweep():
        loop.send_waiting()
        bad_stream, good_stream = loop.open(bad, join_texts), loop.open(good, join_texts)
        bad_stream.send({**text("x"), "unbuildable": True})
        good_stream.send(text("y"))
        good_stream.send(text("end"), final=True)
        loop.send_waiting()
        loop.send_waiting()

    on_thread("reader", sweep)
    assert bad.done.wait(5) and good.done.wait(5)
    assert [entry for entry in log if entry[0] == "bad"] == [("bad", "error: a tensor the stub cannot take", True)]
    assert "".join(t for name, t, _ in log if name == "good") == "yend"


# ---- merge_streamed ------------------------------------------------------------------------------------

def test_merged_responses_join_per_token_outputs_keep_running_values_and_keep_rows_apart():
    def row(index):
        return np.array([[index]], np.int32)

    first = {"text_output": np.array([b"a"], dtype=object), "output_ids": np.array([[[7]]], np.int32),
             "output_log_probs": np.array([[-1.0]], np.float32), "cum_log_probs": np.array([[-1.0]], np.float32),
             "batch_index": row(0)}
    # output_log_probs streams every token's so far, as TensorRT-LLM's llmRequest.cpp createResult sends them
    # (result.logProbs = getLogProbs()), so the later response's holds both tokens'.
    second = {"text_output": np.array([b"b"], dtype=object), "output_ids": np.array([[[8]]], np.int32),
              "output_log_probs": np.array([[-1.0, -2.0]], np.float32), "cum_log_probs": np.array([[-3.0]], np.float32),
              "batch_index": row(0)}
    merged = merge_streamed(first, second, accumulate=False)
    assert merged["text_output"].tolist() == [b"ab"]
    assert merged["output_ids"].tolist() == [[[7, 8]]]
    assert merged["output_log_probs"].tolist() == [[-1.0, -2.0]]  # running values: the later one's
    assert merged["cum_log_probs"].tolist() == [[-3.0]]
    assert merge_streamed(first, {**second, "batch_index": row(1)}, accumulate=False) is None
    assert merge_streamed(first, {k: v for k, v in second.items() if k != "batch_index"}, accumulate=False) is None


def test_an_engines_merged_response_holds_its_tokens_in_order_and_counts_them_all():
    """The engine's responses count their own tokens (sequence_length, num_output_tokens): merged, they add up;
    running values (cum_log_probs, the perf metrics) are the later's; context_logits stay with the first."""
    req = request(return_log_probs=True, return_generation_logits=True, return_num_output_tokens=True,
                  return_context_logits=True, return_perf_metrics=True)
    sender = SlowSender()
    sender.release.set()
    loop = ResponseLoop()
    try:
        with loop.held():  # every response waits: they merge as they come
            stream = engine_stream(loop, sender, [req], merge=True)
            stream.on_event(EngineEvent(req, token_ids=[5], log_probs=[-0.5], generation_logits=np.ones((1, 10)),
                                        context_logits=np.zeros((2, 10))))
            stream.on_event(EngineEvent(req, token_ids=[6, 7], log_probs=[-0.1, -0.2],
                                        generation_logits=np.zeros((2, 10)), drafted_tokens=2,
                                        accepted_draft_tokens=1))
            stream.on_event(EngineEvent(req, finished=True, finish_reason="end_id"))
        assert sender.done.wait(5)
    finally:
        loop.close(5)
    (merged,) = sender.outputs
    assert merged["output_ids"].reshape(-1).tolist() == [5, 6, 7] and sender.finals == [True]
    assert merged["output_log_probs"].reshape(-1).tolist() == pytest.approx([-0.5, -0.1, -0.2])
    assert merged["cum_log_probs"].item() == pytest.approx(-0.8)
    assert merged["generation_logits"].shape == (1, 1, 3, 10) and merged["context_logits"].shape == (1, 2, 10)
    assert merged["sequence_length"].item() == 3 and merged["num_output_tokens"].item() == 3
    assert merged["total_accepted_draft_tokens"].item() == 1 and merged["total_draft_tokens"].item() == 2


def test_an_engine_error_ends_the_stream_after_what_waited_before_it():
    req = request()
    sender = SlowSender()
    sender.release.set()
    loop = ResponseLoop()
    try:
        with loop.held():
            stream = engine_stream(loop, sender, [req], merge=True)
            stream.on_event(EngineEvent(req, token_ids=[5]))
            stream.on_event(EngineEvent(req, error=RuntimeError("boom"), finished=True))
            stream.on_event(EngineEvent(req, token_ids=[6]))  # after the end: dropped
        assert sender.done.wait(5)
    finally:
        loop.close(5)
    assert sender.sent == [[5], "error: boom"]


# ---- the embedded engine's streams -----------------------------------------------------------------------------

def request(streaming=True, request_id="r", **kw) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, batch_index=0, batch_size=1, prompt=(1, 2), max_new_tokens=8,
                             sampling=SamplingParams(), streaming=streaming, **kw)


def engine_stream(loop: ResponseLoop, sender, requests: list[GenerationRequest], merge=False) -> TritonRequestStream:
    """A Triton request's stream as the engine's model opens it (model_repository/tensorrt_llm)."""
    return TritonRequestStream(requests, loop.open(sender, merge_responses if merge else None, merge_final=True),
                               vocab_size=10)


class SlowSender:
    """Blocks on its first send until released, so later events pile up behind it."""

    def __init__(self):
        self.sent = []  # each response's tokens, and "error: ..." for an error, in the order sent
        self.outputs = []
        self.finals = []
        self.sending = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def send(self, outputs, final=False):
        self.sending.set()
        self.release.wait(5)
        self.sent.append(outputs["output_ids"].reshape(-1).tolist())
        self.outputs.append(outputs)
        self.finals.append(final)
        if final:
            self.done.set()

    def send_error(self, error):
        self.sent.append(f"error: {error}")
        self.done.set()

    def finish(self):
        self.done.set()


def sending_first_token(merge=False):
    """A loop whose first response (token 1) is being sent, held until sender.release is set."""
    req = request()
    sender = SlowSender()
    loop = ResponseLoop()
    stream = engine_stream(loop, sender, [req], merge)
    stream.on_event(EngineEvent(req, token_ids=[1]))
    assert sender.sending.wait(5)
    return req, sender, stream, loop


@pytest.mark.parametrize("merge, sent", [
    (True, [[1], [2, 3, 4, 5]]),  # the waiting tokens go out together
    (False, [[1], [2], [3], [4], [5]]),  # by default like the C++ backend: one response per step, never merged
])
def test_an_engines_tokens_that_wait_merge_only_when_asked(merge, sent):
    req, sender, stream, loop = sending_first_token(merge)
    try:
        for token in (2, 3, 4):  # generated while the first response is still being sent
            stream.on_event(EngineEvent(req, token_ids=[token]))
        stream.on_event(EngineEvent(req, token_ids=[5], finished=True, finish_reason="length"))
        sender.release.set()
        assert sender.done.wait(5)
    finally:
        loop.close(5)
    assert sender.sent == sent and sender.finals[-1]


def test_the_engine_waits_while_two_steps_of_responses_wait_to_be_sent():
    """wait_for_backlog bounds what the stand-in queues for sending (TensorRT-LLM sends as fast as it
    generates; a Python sender on few cores does not)."""
    req, sender, stream, loop = sending_first_token()  # it hangs: the responses stay in the backlog
    try:
        stream.on_event(EngineEvent(req, token_ids=[2]))
        loop.wait_for_backlog(responses_per_step=1, timeout_s=5)  # 2 waiting: within two steps, no wait
        stream.on_event(EngineEvent(req, token_ids=[3]))
        waited = threading.Event()
        engine = threading.Thread(target=lambda: (loop.wait_for_backlog(1, timeout_s=5), waited.set()))
        engine.start()
        assert not waited.wait(0.3), "3 responses waiting for a 1-sequence engine: it must wait"
        sender.release.set()  # sending catches up
        assert waited.wait(5)
        stream.on_event(EngineEvent(req, token_ids=[4], finished=True, finish_reason="length"))
        assert sender.done.wait(5)
    finally:
        loop.close(5)
    assert sender.sent == [[1], [2], [3], [4]]


def test_a_hung_send_slows_the_engine_down_but_never_stops_it():
    req, sender, stream, loop = sending_first_token()  # never released until the end
    try:
        for token in range(2, 6):
            stream.on_event(EngineEvent(req, token_ids=[token]))
        started = time.monotonic()
        loop.wait_for_backlog(responses_per_step=1, timeout_s=0.2)
        assert 0.15 < time.monotonic() - started < 2
    finally:
        sender.release.set()
        loop.close(5)


def test_a_backlog_goes_out_one_response_per_stream_per_round():
    """When sending falls behind, the loop sends as a GPU engine emits, one token per stream per step,
    and a stream that arrives meanwhile gets its first token before the others' backlogs, not after them."""
    gate = threading.Event()
    order = []

    class Recorder(SlowSender):
        """All streams' sends held by one gate and logged in one order."""

        def __init__(self, name):
            super().__init__()
            self.name = name

        def send(self, outputs, final=False):
            gate.wait(5)
            order.append((self.name, outputs["output_ids"].reshape(-1).tolist()[0]))
            if final:
                self.done.set()

    reqs = {name: request(request_id=name) for name in "abc"}
    senders = {name: Recorder(name) for name in "abc"}
    loop = ResponseLoop()
    streams = {name: engine_stream(loop, senders[name], [reqs[name]]) for name in "abc"}
    try:
        gate.set()
        for name, token in (("a", 1), ("b", 11)):  # both streams have started
            streams[name].on_event(EngineEvent(reqs[name], token_ids=[token]))
        while len(order) < 2:
            time.sleep(0.01)
        gate.clear()  # sending stalls: the engine runs ahead
        streams["a"].on_event(EngineEvent(reqs["a"], token_ids=[2]))
        time.sleep(0.1)  # the loop is now held in a2's send
        for token in (3, 4):
            streams["a"].on_event(EngineEvent(reqs["a"], token_ids=[token]))
        for token in (12, 13):
            streams["b"].on_event(EngineEvent(reqs["b"], token_ids=[token]))
        streams["c"].on_event(EngineEvent(reqs["c"], token_ids=[21]))  # a new request
        for name, token in (("a", 5), ("b", 14), ("c", 22)):
            streams[name].on_event(EngineEvent(reqs[name], token_ids=[token], finished=True, finish_reason="length"))
        gate.set()
        assert all(sender.done.wait(5) for sender in senders.values())
    finally:
        gate.set()
        loop.close(5)
    assert order[:3] == [("a", 1), ("b", 11), ("a", 2)]  # a2 was being sent while the backlog built up
    # then rounds of one response per stream, the stream still waiting for its first response first
    assert order[3:] == [("c", 21), ("a", 3), ("b", 12), ("c", 22), ("a", 4), ("b", 13), ("a", 5), ("b", 14)]


def test_a_round_is_sent_inside_one_cork():
    """Behind the relay a round's responses go to it in one write (the loop holds `corked()` while it sends a
    round), as the C++ backend sends a step's responses back to back."""
    held = []  # True for each send made while corked
    corked_now = [False]

    class Cork:
        def __enter__(self):
            corked_now[0] = True

        def __exit__(self, *exc):
            corked_now[0] = False

    class Recorder(SlowSender):
        def send(self, outputs, final=False):
            held.append(corked_now[0])
            if final:
                self.done.set()

    reqs = [request(request_id=str(i)) for i in range(3)]
    senders = [Recorder() for _ in reqs]
    loop = ResponseLoop(corked=Cork)
    try:
        for req, sender in zip(reqs, senders, strict=True):
            stream = engine_stream(loop, sender, [req])
            stream.on_event(EngineEvent(req, token_ids=[1]))
            stream.on_event(EngineEvent(req, token_ids=[2], finished=True, finish_reason="length"))
        assert all(sender.done.wait(5) for sender in senders)
    finally:
        loop.close(5)
    assert len(held) == 6 and all(held)


def test_a_steps_responses_wait_for_the_step_to_end():
    """While held (a paced engine's step) nothing is sent: the step hands its responses over together when it ends."""
    reqs = [request(request_id=str(i)) for i in range(3)]
    senders = [SlowSender() for _ in reqs]
    for sender in senders:
        sender.release.set()
    loop = ResponseLoop()
    try:
        with loop.held():
            for req, sender in zip(reqs, senders, strict=True):
                stream = engine_stream(loop, sender, [req])
                stream.on_event(EngineEvent(req, token_ids=[1], finished=True, finish_reason="length"))
            time.sleep(0.2)
            assert not any(sender.sending.is_set() for sender in senders), "sent before the step ended"
        assert all(sender.done.wait(5) for sender in senders)
    finally:
        loop.close(5)
    assert [sender.sent for sender in senders] == [[[1]]] * 3
