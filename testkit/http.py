"""The one HTTP client of the tests and tools: `generate` and `generate_stream` (server-sent events) on a
keep-alive http.client connection.

Streamed events are only timestamped while a stream runs (parsed afterwards): benchmark clients share the
machine's cores with the server, so every microsecond spent per token here is taken from the server.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


class HttpError(RuntimeError):
    """A non-200 answer (status, and the server's error message), or an in-band stream error (status 200)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class Hung(TimeoutError):
    """No response within the client's timeout."""


@dataclass
class StreamTrace:
    """One generate_stream call: when it was sent, and each SSE data event's arrival time and raw JSON."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)

    @property
    def events(self) -> list[dict]:
        """The parsed events; an in-band error event raises HttpError(200, message)."""
        events = [json.loads(payload) for payload in self.payloads]
        for event in events:
            if "error" in event:
                raise HttpError(200, event["error"])
        return events

    @property
    def text(self) -> str:
        return "".join(event.get("text_output", "") for event in self.events)

    @property
    def first_event_s(self) -> float:
        return self.arrivals[0] - self.sent

    @property
    def duration_s(self) -> float:
        return self.arrivals[-1] - self.sent


class HttpSession:
    """One keep-alive connection (use one per thread)."""

    def __init__(self, http_url: str, timeout_s: float = 300.0):
        host, _, port = http_url.rpartition(":")
        self._timeout_s = timeout_s
        self._connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)

    def post_json(self, path: str, body: dict) -> dict:
        response = self._post(path, body)
        payload = response.read()
        if response.status != 200:
            raise HttpError(response.status, _error_message(payload))
        return json.loads(payload)

    def generate(self, model: str, body: dict) -> dict:
        return self.post_json(f"/v2/models/{model}/generate", body)

    def stream_events(self, model: str, body: dict) -> Iterator[tuple[float, bytes]]:
        """(arrival time, raw JSON) of each SSE data event, as they arrive. Closing the generator early
        closes the connection: that is how an HTTP client disconnects mid-stream."""
        response = self._post(f"/v2/models/{model}/generate_stream", body)
        if response.status != 200:
            raise HttpError(response.status, _error_message(response.read()))
        try:
            while line := response.readline():
                if line.startswith(b"data:"):
                    yield time.perf_counter(), line[5:]
        except TimeoutError as error:
            raise Hung(f"no event within {self._timeout_s:.0f} s") from error
        except GeneratorExit:
            self.close()
            raise

    def generate_stream(self, model: str, body: dict,
                        on_event: Callable[[dict], None] | None = None) -> StreamTrace:
        """One streamed request; `on_event` (if given) sees each event as it arrives."""
        trace = StreamTrace(sent=time.perf_counter())
        for arrival, payload in self.stream_events(model, body):
            trace.arrivals.append(arrival)
            trace.payloads.append(payload)
            if on_event is not None:
                on_event(json.loads(payload))
        return trace

    def close(self) -> None:
        self._connection.close()

    def _post(self, path: str, body: dict) -> http.client.HTTPResponse:
        try:
            self._connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            return self._connection.getresponse()
        except TimeoutError as error:
            raise Hung(f"no answer within {self._timeout_s:.0f} s") from error


def _error_message(payload: bytes) -> str:
    text = payload.decode(errors="replace")
    try:
        return json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return text[:500]


def generate(http_url: str, model: str, body: dict, timeout: float = 120) -> dict:
    session = HttpSession(http_url, timeout)
    try:
        return session.generate(model, body)
    finally:
        session.close()


def generate_stream(http_url: str, model: str, body: dict, timeout: float = 120) -> list[dict]:
    """All events of one generate_stream call; an in-band error raises HttpError(200, message)."""
    session = HttpSession(http_url, timeout)
    try:
        return session.generate_stream(model, body).events
    finally:
        session.close()


def streamed_texts(http_url: str, model: str, bodies: list[dict], timeout: float = 120) -> list[str]:
    """Each body streamed at once (one connection each, all concurrent): the text each stream's events add up to."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(bodies)) as pool:
        streams = list(pool.map(lambda body: generate_stream(http_url, model, {**body, "stream": True}, timeout),
                                bodies))
    return ["".join(event["text_output"] for event in events) for events in streams]
