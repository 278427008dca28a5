"""bls.relay.sending: sending threads, streams merged while they wait, first responses first; a thread that sends
what it queues itself (send_waiting)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bls.relay.sending import ResponseLoop


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
