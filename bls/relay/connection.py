"""A process's connection to a relay (RelayConnection, one per relay socket: RelayConnections): the streams it
claimed and their cancellations, the frames it writes (whole, in call order, gathered while corked), and its engine
calls (RelayEngineCall), whose responses its reader thread hands on, a burst at a time.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np

from bls.relay.frames import (
    CANCELLED,
    ENGINE_ERROR,
    ENGINE_FINAL,
    ENGINE_RESPONSE,
    HEADER,
    STREAM_KINDS,
    RelayedRequest,
    claim_frame,
    decode_tensors,
    engine_cancel_frame,
    engine_request_frame,
    relay_frames,
)

_RECV_BYTES = 1 << 16
log = logging.getLogger(__name__)


class RelayDisconnected(ConnectionError):
    """The connection to the relay is gone, or an engine call was stopped before its end."""


class EngineCallError(RuntimeError):
    """The engine (or Triton, on its way there) answered an engine call with an error: its code and message."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class RelayEngineCall:
    """One engine request sent through the relay, its responses handed on by the connection's reader thread."""

    def __init__(self, connection: RelayConnection, call: int, on_event: Callable[[dict], bool],
                 on_end: Callable[[], None] | None):
        self._connection = connection
        self._call = call
        self._on_event = on_event
        self._on_end = on_end
        self._done = threading.Event()
        self._outcome: BaseException | bool | None = None  # True: read to the end; False: on_event stopped it

    def wait(self) -> bool:
        """Block until the call ends: True when read to its end, False when on_event stopped it. Raises
        EngineCallError, RelayDisconnected (stop(), or the connection broke), or what on_event raised."""
        self._done.wait()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return bool(self._outcome)

    def stop(self) -> None:
        """Cancel from any thread: the call ends with RelayDisconnected, and the relay cancels the engine request."""
        if self._connection._forget(self._call):
            self._cancel_in_relay()
            self._finish(RelayDisconnected("stopped"))

    def _cancel_in_relay(self) -> None:
        try:
            self._connection.write(engine_cancel_frame(self._call), now=True)
        except OSError:
            pass  # the connection broke: the relay cancels the calls of a connection it loses

    def _handle(self, kind: int, body: memoryview) -> None:
        """One frame of this call (the reader thread; the call has been forgotten if the frame is final)."""
        try:
            if kind == ENGINE_ERROR:
                (code,) = struct.unpack_from("<I", body)
                self._finish(EngineCallError(code, bytes(body[4:]).decode(errors="replace")))
                return
            tensors = decode_tensors(body)
            if kind == ENGINE_FINAL:
                if tensors:
                    self._on_event(tensors)
                self._finish(True)
            elif self._on_event(tensors) is False and self._connection._forget(self._call):
                self._cancel_in_relay()
                self._finish(False)
        except BaseException as error:  # noqa: BLE001 - it ends this call, never the reader
            if self._connection._forget(self._call):
                self._cancel_in_relay()
            self._finish(error)

    def _finish(self, outcome: BaseException | bool) -> None:
        if self._done.is_set():
            return
        self._outcome = outcome
        self._done.set()
        if self._on_end is not None:
            self._on_end()


class RelayConnection:
    """This process's connection to one relay; frames from any thread, each written whole, in call order.

    While corked (RelayConnections.corked), frames gather and go out in one write when it ends: the engine reader
    sends a sweep's responses of many streams so, one system call for all (a final frame, and what gathered
    before it, is written at once: the child request may complete only after it). A thread (`relay-reader`) reads
    what the relay writes back: which claimed streams were cancelled, and the engine calls' responses."""

    # While engine responses keep coming, read at most this often: one wake-up (and one send of what the read
    # queued) for many responses; an engine step of 10-50 ms waits at most this much more.
    SWEEP_S = 0.002

    def __init__(self, socket_name: str, after_sweep: Callable[[], None] | None = None):
        """`after_sweep`: run on the reader thread after each read that brought engine responses (the BLS sends
        there what they queued, all at once)."""
        self._socket_name = socket_name
        self._after_sweep = after_sweep
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._corks = 0
        self._gathered: list[bytes] = []
        self._claims: dict[int, Callable[[], None]] = {}  # stream -> what its cancellation calls
        self._calls: dict[int, RelayEngineCall] = {}  # engine calls not ended
        self._next_call = 1

    def call_engine(self, model_name: str, inputs: Mapping[str, np.ndarray], outputs: Iterable[str],
                    request_id: str, on_event: Callable[[dict], bool], on_end: Callable[[], None] | None = None,
                    on_open: Callable[[RelayEngineCall], None] | None = None) -> RelayEngineCall:
        """Send one engine request through the relay. Each response's tensors go to `on_event(tensors)` on the
        reader thread, which must not block: returning False ends the call (the relay cancels the request);
        `on_end()` runs once it has ended, with this connection's lock held when the connection broke: it must
        only take note. `on_open(call)` runs before the request is sent, so that another thread can stop() it (a
        call stopped by then is not sent). Raises RelayDisconnected when the relay cannot be reached."""
        with self._lock:
            number = self._next_call
            self._next_call += 1
            call = self._calls[number] = RelayEngineCall(self, number, on_event, on_end)
        frame = engine_request_frame(number, model_name, request_id, outputs, inputs)
        if on_open is not None:
            on_open(call)
        with self._lock:
            if number not in self._calls:
                return call  # stopped already
            self._gathered.append(frame)
            try:
                self._write_gathered()
            except OSError as error:
                self._calls.pop(number, None)
                raise RelayDisconnected(f"the relay cannot be reached ({error})") from None
        return call

    def _forget(self, call: int) -> bool:
        """Whether the call was still open (it is not any more)."""
        with self._lock:
            return self._calls.pop(call, None) is not None

    def claim(self, relayed: RelayedRequest, on_cancelled: Callable[[], None]) -> None:
        """Tell the relay that this connection sends the stream, presenting its token. `on_cancelled()` runs if its
        client cancels it, or if the connection breaks (the relay then ends the streams claimed on it); on the
        connection's reader thread or a writing thread, with the connection's lock held: it must only take note.
        Raises OSError as write() does."""
        with self._lock:
            self._claims[relayed.stream] = on_cancelled
        self.write(claim_frame(relayed.stream, relayed.token))

    def release(self, stream: int) -> None:
        """The stream has ended: its cancellation no longer matters."""
        with self._lock:
            self._claims.pop(stream, None)

    def write(self, frame: bytes, now: bool = False) -> None:
        """One whole frame. Raises OSError when the relay cannot be reached (it was unloaded, or the server is
        stopping). `now`: written at once even while corked, after what gathered before it. A stream's frame is
        dropped unless the stream is claimed on this connection: its claim went with a connection that broke, and
        the relay, which has ended the stream, would close this one for it."""
        with self._lock:
            if frame[12] in STREAM_KINDS and HEADER.unpack_from(frame)[1] not in self._claims:
                return  # its claim went with a connection that broke: the relay has ended the stream
            self._gathered.append(frame)
            if self._corks and not now:
                return
            self._write_gathered()

    def _write_gathered(self) -> None:
        """With the lock held."""
        data, self._gathered = b"".join(self._gathered), []
        if self._socket is None:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(self._socket_name)
            except OSError:
                connection.close()
                raise
            self._socket = connection
            threading.Thread(target=self._read_frames, args=(connection,), name="relay-reader", daemon=True).start()
        try:
            self._socket.sendall(data)
        except OSError:
            self._broken()  # a frame may be cut; the next write opens a new connection
            raise

    def _broken(self) -> None:
        """The connection is gone (with the lock held): the relay ends every stream claimed on it, so they are
        all cancelled here, and cancels its engine calls, which end here with RelayDisconnected."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the reader thread
        except OSError:
            pass
        self._socket.close()
        self._socket = None
        self._gathered.clear()  # frames of the streams and calls that end here: never for the next connection
        claims, self._claims = self._claims, {}
        for on_cancelled in claims.values():
            on_cancelled()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call._finish(RelayDisconnected("the connection to the relay broke"))

    def _read_frames(self, connection: socket.socket) -> None:
        pending = b""
        while True:
            swept = time.monotonic()
            try:
                data = connection.recv(_RECV_BYTES)
            except OSError:
                data = b""
            try:
                frames, pending = relay_frames(pending + data)
            except ValueError as error:
                log.error("relay %s: %s; closing the connection", self._socket_name, error)
                data, frames = b"", []
            if not data:  # closed by the relay (unloading, or it dropped a malformed frame), or by us
                with self._lock:
                    if self._socket is connection:
                        self._broken()
                return
            engine_events = 0
            for stream, kind, body in frames:
                if kind == CANCELLED:
                    with self._lock:
                        on_cancelled = self._claims.get(stream)
                        if on_cancelled is not None:
                            on_cancelled()
                    continue
                engine_events += 1
                with self._lock:
                    call = self._calls.pop(stream, None) if kind != ENGINE_RESPONSE else self._calls.get(stream)
                if call is not None:  # else stopped: the relay has been told
                    call._handle(kind, body)
            if engine_events and self._after_sweep is not None:
                try:
                    self._after_sweep()
                except Exception:
                    log.exception("relay %s: the after-sweep call failed", self._socket_name)
            pause = swept + self.SWEEP_S - time.monotonic()
            if engine_events > 1 and pause > 0:
                time.sleep(pause)  # let the next responses gather: one wake-up for many

    def _cork(self) -> None:
        with self._lock:
            self._corks += 1

    def _uncork(self) -> None:
        with self._lock:
            self._corks -= 1
            if self._corks or not self._gathered:
                return
            frames = len(self._gathered)
            try:
                self._write_gathered()
            except OSError as error:  # their streams were cancelled (_broken): the relay has ended them
                log.warning("relay %s: %d frames could not be written (%s)", self._socket_name, frames, error)

    def close(self) -> None:
        with self._lock:
            self._gathered.clear()
            self._claims.clear()
            if self._socket is not None:
                self._broken()


class RelayConnections:
    """One connection per relay socket, for the process's lifetime (a model has one relay)."""

    def __init__(self, after_sweep: Callable[[], None] | None = None) -> None:
        """`after_sweep`: see RelayConnection."""
        self._after_sweep = after_sweep
        self._lock = threading.Lock()
        self._connections: dict[str, RelayConnection] = {}

    def get(self, socket_name: str) -> RelayConnection:
        with self._lock:
            connection = self._connections.get(socket_name)
            if connection is None:
                connection = self._connections[socket_name] = RelayConnection(socket_name, self._after_sweep)
            return connection

    @contextmanager
    def corked(self) -> Iterator[None]:
        """Frames written meanwhile, by any thread, go out together at the end (RelayConnection)."""
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            connection._cork()
        try:
            yield
        finally:
            for connection in connections:
                connection._uncork()

    def close(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()
