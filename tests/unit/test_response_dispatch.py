"""Engine responses leave on their own thread: one per engine step (TensorRT-LLM's streaming), or merged
when sending falls behind generation and the deployment asked for merging."""

import threading
import time

import numpy as np

from embedded_engine.request import GenerationRequest
from embedded_engine.responses import ResponseDispatcher, TritonRequestStream, merge_events
from embedded_engine.sampling import SamplingParams
from embedded_engine.scheduler import EngineEvent


def request(streaming=True, request_id="r", **kw) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, batch_index=0, batch_size=1, prompt=(1, 2), max_new_tokens=8,
                             sampling=SamplingParams(), streaming=streaming, **kw)


def test_merge_keeps_order_and_the_last_finish():
    req = request(return_log_probs=True)
    merged = merge_events([
        EngineEvent(req, token_ids=[5], log_probs=[-0.5], generation_logits=np.ones((1, 3))),
        EngineEvent(req, token_ids=[6, 7], log_probs=[-0.1, -0.2], generation_logits=np.zeros((2, 3)),
                    accepted_draft_tokens=1),
        EngineEvent(req, finished=True, finish_reason="end_id"),
    ])
    assert merged.token_ids == [5, 6, 7] and merged.log_probs == [-0.5, -0.1, -0.2]
    assert merged.generation_logits.shape == (3, 3) and merged.accepted_draft_tokens == 1
    assert merged.finished and merged.finish_reason == "end_id"


def test_merge_stops_at_an_error():
    req = request()
    error = RuntimeError("boom")
    merged = merge_events([EngineEvent(req, token_ids=[5]), EngineEvent(req, error=error, finished=True)])
    assert merged.error is error


class SlowSender:
    """Blocks on its first send until released, so later events pile up behind it."""

    def __init__(self):
        self.sent = []
        self.sending = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def send(self, outputs, final=False):
        self.sending.set()
        self.release.wait(5)
        self.sent.append(outputs["output_ids"].reshape(-1).tolist())
        if final:
            self.done.set()

    def send_error(self, error):
        self.done.set()

    def finish(self):
        self.done.set()


def sending_first_token(merge=False):
    """A dispatcher whose first response (token 1) is being sent, held until sender.release is set."""
    req = request()
    sender = SlowSender()
    stream = TritonRequestStream([req], sender, vocab_size=10)
    dispatcher = ResponseDispatcher(merge=merge)
    dispatcher.submit(stream, EngineEvent(req, token_ids=[1]))
    assert sender.sending.wait(5)
    return req, sender, stream, dispatcher


def test_dispatcher_merges_tokens_that_wait():
    req, sender, stream, dispatcher = sending_first_token(merge=True)
    try:
        for token in (2, 3, 4):  # generated while the first response is still being sent
            dispatcher.submit(stream, EngineEvent(req, token_ids=[token]))
        dispatcher.submit(stream, EngineEvent(req, token_ids=[5], finished=True, finish_reason="length"))
        sender.release.set()
        assert sender.done.wait(5)
    finally:
        dispatcher.shutdown()
    assert [t for chunk in sender.sent for t in chunk] == [1, 2, 3, 4, 5]
    assert sender.sent[0] == [1] and len(sender.sent) == 2  # the waiting tokens went out together


def test_dispatcher_sends_one_response_per_step_by_default():
    req, sender, stream, dispatcher = sending_first_token()
    try:
        for token in (2, 3, 4):  # generated while the first response is still being sent
            dispatcher.submit(stream, EngineEvent(req, token_ids=[token]))
        dispatcher.submit(stream, EngineEvent(req, token_ids=[5], finished=True, finish_reason="length"))
        sender.release.set()
        assert sender.done.wait(5)
    finally:
        dispatcher.shutdown()
    assert sender.sent == [[1], [2], [3], [4], [5]]  # like the C++ backend: never merged


def test_the_engine_waits_while_two_steps_of_responses_wait_to_be_sent():
    """wait_for_backlog bounds what the stand-in queues for sending (TensorRT-LLM sends as fast as it
    generates; a Python sender on few cores does not)."""
    req, sender, stream, dispatcher = sending_first_token()  # it hangs: the events stay in the backlog
    try:
        dispatcher.submit(stream, EngineEvent(req, token_ids=[2]))
        dispatcher.wait_for_backlog(events_per_step=1, timeout_s=5)  # 2 waiting: within two steps, no wait
        dispatcher.submit(stream, EngineEvent(req, token_ids=[3]))
        waited = threading.Event()
        engine = threading.Thread(target=lambda: (dispatcher.wait_for_backlog(1, timeout_s=5), waited.set()))
        engine.start()
        assert not waited.wait(0.3), "3 responses waiting for a 1-sequence engine: it must wait"
        sender.release.set()  # sending catches up
        assert waited.wait(5)
        dispatcher.submit(stream, EngineEvent(req, token_ids=[4], finished=True, finish_reason="length"))
        assert sender.done.wait(5)
    finally:
        dispatcher.shutdown()
    assert sender.sent == [[1], [2], [3], [4]]


def test_a_hung_send_slows_the_engine_down_but_never_stops_it():
    req, sender, stream, dispatcher = sending_first_token()  # never released until the end
    try:
        for token in range(2, 6):
            dispatcher.submit(stream, EngineEvent(req, token_ids=[token]))
        started = time.monotonic()
        dispatcher.wait_for_backlog(events_per_step=1, timeout_s=0.2)
        assert 0.15 < time.monotonic() - started < 2
    finally:
        sender.release.set()
        dispatcher.shutdown()


def test_a_backlog_goes_out_one_response_per_stream_per_round():
    """When sending falls behind, the dispatcher sends as a GPU engine emits, one token per stream per step,
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
    streams = {name: TritonRequestStream([reqs[name]], senders[name], vocab_size=10) for name in "abc"}
    dispatcher = ResponseDispatcher()
    try:
        gate.set()
        for name, token in (("a", 1), ("b", 11)):  # both streams have started
            dispatcher.submit(streams[name], EngineEvent(reqs[name], token_ids=[token]))
        while len(order) < 2:
            time.sleep(0.01)
        gate.clear()  # sending stalls: the engine runs ahead
        dispatcher.submit(streams["a"], EngineEvent(reqs["a"], token_ids=[2]))
        time.sleep(0.1)  # the dispatcher is now held in a2's send
        for token in (3, 4):
            dispatcher.submit(streams["a"], EngineEvent(reqs["a"], token_ids=[token]))
        for token in (12, 13):
            dispatcher.submit(streams["b"], EngineEvent(reqs["b"], token_ids=[token]))
        dispatcher.submit(streams["c"], EngineEvent(reqs["c"], token_ids=[21]))  # a new request
        for name, token in (("a", 5), ("b", 14), ("c", 22)):
            dispatcher.submit(streams[name], EngineEvent(reqs[name], token_ids=[token], finished=True,
                                                         finish_reason="length"))
        gate.set()
        assert all(sender.done.wait(5) for sender in senders.values())
    finally:
        gate.set()
        dispatcher.shutdown()
    assert order[:3] == [("a", 1), ("b", 11), ("a", 2)]  # a2 was being sent while the backlog built up
    # then rounds of one response per stream, the stream still waiting for its first response first
    assert order[3:] == [("c", 21), ("a", 3), ("b", 12), ("c", 22), ("a", 4), ("b", 13), ("a", 5), ("b", 14)]


def test_a_round_is_sent_inside_one_cork():
    """Behind the relay a round's responses go to it in one write (the dispatcher holds `corked()` while it
    sends a round), as the C++ backend sends a step's responses back to back."""
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
    dispatcher = ResponseDispatcher(corked=Cork)
    try:
        for req, sender in zip(reqs, senders, strict=True):
            stream = TritonRequestStream([req], sender, vocab_size=10)
            dispatcher.submit(stream, EngineEvent(req, token_ids=[1]))
            dispatcher.submit(stream, EngineEvent(req, token_ids=[2], finished=True, finish_reason="length"))
        assert all(sender.done.wait(5) for sender in senders)
    finally:
        dispatcher.shutdown()
    assert len(held) == 6 and all(held)


def test_a_steps_events_wait_for_the_step_to_end():
    """Inside step() nothing is sent: a paced engine's step hands its responses over together when it ends."""
    reqs = [request(request_id=str(i)) for i in range(3)]
    senders = [SlowSender() for _ in reqs]
    for sender in senders:
        sender.release.set()
    dispatcher = ResponseDispatcher()
    try:
        with dispatcher.step():
            for req, sender in zip(reqs, senders, strict=True):
                stream = TritonRequestStream([req], sender, vocab_size=10)
                dispatcher.submit(stream, EngineEvent(req, token_ids=[1], finished=True, finish_reason="length"))
            time.sleep(0.2)
            assert not any(sender.sending.is_set() for sender in senders), "sent before the step ended"
        assert all(sender.done.wait(5) for sender in senders)
    finally:
        dispatcher.shutdown()
    assert [sender.sent for sender in senders] == [[[1]]] * 3
