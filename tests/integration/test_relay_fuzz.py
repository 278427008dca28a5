"""The relay locked down, under a real tritonserver: only the server's user reaches its socket (a 0700 directory,
and SO_PEERCRED at accept), and a connection that sends anything it may not (random bytes, truncated frames,
impossible lengths, frames or claims for streams it was not handed, wrong tokens, engine calls to models the
repository does not configure, kinds only the relay writes) is closed, while the server keeps serving and a
client's stream running meanwhile is not touched (relay/frames.md, Rules).

Starts its own server (not possible with --server-url); needs a C++ compiler for the relay. The stand-in engine is
paced (20 ms a token) so that one legitimate stream is running through every hostile connection: it is the
server's first request to tensorrt_llm_bls, so its stream number is 1.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import stat
import struct
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bls.relay.frames import (
    CLAIM,
    ENGINE_FINAL,
    ENGINE_RESPONSE,
    claim_frame,
    encode_tensors,
    engine_request_frame,
    error_frame,
    relay_frames,
    response_frame,
    stream_token,
)
from engine_build.repository import can_compile_relay
from testkit.http import HttpError, HttpSession, generate, generate_stream
from tests.integration.conftest import built_repository_server
from tests.integration.test_bls import BLS, streamed_text
from tests.integration.test_engine import OUTPUTS, engine_inputs

LEGIT = {"text_input": "Once upon a time", "max_tokens": 400, "end_id": -1}  # 8 s at 20 ms a token
LEGIT_STREAM = 1
NEVER_HANDED_OUT = 1 << 40
_random = random.Random(20261125)


class Legit:
    """The legitimate stream, read on a thread while the hostile connections come and go."""

    def __init__(self, http_url: str):
        self.started = threading.Event()
        self.events: list[dict] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(http_url,), daemon=True)
        self._thread.start()

    def _run(self, http_url: str) -> None:
        session = HttpSession(http_url, 120)
        try:
            session.generate_stream(BLS, {**LEGIT, "stream": True},
                                    on_event=lambda event: (self.events.append(event), self.started.set()))
        except BaseException as error:  # noqa: BLE001 - reported by the test that checks it
            self.error = error
        finally:
            session.close()
            self.started.set()

    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        self._thread.join(120)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("the relay needs a C++ compiler (g++ or CXX)")
    with built_repository_server(request, tmp_path_factory, "relay-fuzz", synthetic=True, step_ms=20.0) as server:
        yield server


@pytest.fixture(scope="module")
def legit(server):
    stream = Legit(server.http_url)
    assert stream.started.wait(60) and stream.error is None, stream.error
    return stream


@pytest.fixture(scope="module")
def socket_path(server) -> str:
    found = re.search(rf"{BLS}: sends the responses of \S+ \(its processes connect to (\S+)\)",
                      Path(server.log_path).read_text(errors="replace"))
    assert found, "the relay did not log its socket"
    return found.group(1)


def _closed_by_the_relay(path: str, data: bytes, end_input: bool = False) -> bool:
    """Connects as this (the server's) user, sends `data` (then ends its input, if asked) and reads until the relay
    closes the connection (True) or 10 s pass (False)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(10)
        connection.connect(path)
        try:
            connection.sendall(data)
            if end_input:
                connection.shutdown(socket.SHUT_WR)
            while connection.recv(65536):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            return False
        return True


def _frame(stream: int, kind: int, body: bytes) -> bytes:
    return struct.pack("<IQB", 9 + len(body), stream, kind) + body


def _random_frame() -> bytes:
    """A well-delimited frame of random content: a random kind (mostly ones that exist), random bytes after it."""
    body = bytes(_random.getrandbits(8) for _ in range(_random.randrange(1, 200)))
    return _frame(_random.getrandbits(64), _random.randrange(12), body)


def _text(value: str) -> bytes:
    return encode_tensors({"text_output": np.array([value.encode()], dtype=object)})


def _bad_shape() -> bytes:
    """A response whose INT32 tensor says 4 elements and carries 1."""
    name = b"num_output_tokens"
    return struct.pack(f"<HH{len(name)}sBBqQ", 1, len(name), name, 8, 1, 4, 4) + struct.pack("<i", 7)


# case: (its bytes, whether the input then ends, why the relay closes it: in its log; None for random content)
HOSTILE = {
    "random bytes, then the end of input": (lambda: bytes(_random.getrandbits(8) for _ in range(4096)), True, None),
    **{f"random frame {i}": (_random_frame, False, None) for i in range(8)},
    "a truncated frame, then the end of input": (
        lambda: response_frame(LEGIT_STREAM, _text("x"), False)[:-3], True,
        "it closed the connection in the middle of a frame"),
    "a length over the maximum": (lambda: struct.pack("<I", 0xFFFFFFF0) + bytes(64), False,
                                  "a frame announcing 4294967280 bytes"),
    "a length shorter than a header": (lambda: struct.pack("<I", 3) + b"abc", False, "a frame announcing 3 bytes"),
    "an unknown kind": (lambda: _frame(NEVER_HANDED_OUT, 10, b""), False, "a frame of unknown kind 10"),
    "a kind only the relay writes": (lambda: _frame(7, ENGINE_RESPONSE, encode_tensors({})), False,
                                     "a frame of kind 7, which only the relay writes"),
    "a response whose data does not match its shape": (
        lambda: _frame(LEGIT_STREAM, 0, _bad_shape()), False,
        "tensor num_output_tokens's data does not match its shape"),
    "a response for a stream never handed out": (
        lambda: response_frame(NEVER_HANDED_OUT, _text("x"), True), False,
        f"a frame for stream {NEVER_HANDED_OUT}, which was never handed out"),
    "a response for a stream another connection claimed": (
        lambda: response_frame(LEGIT_STREAM, _text("injected"), True), False,
        "a frame for stream 1, which another connection claimed"),
    "an error for a stream another connection claimed": (
        lambda: error_frame(LEGIT_STREAM, 1, "hijacked"), False, "a frame for stream 1, which another connection"),
    "a claim with a wrong token": (lambda: claim_frame(LEGIT_STREAM, bytes(16)), False,
                                   "a claim of stream 1 with the wrong token"),
    "a claim with a short token": (lambda: _frame(LEGIT_STREAM, CLAIM, bytes(8)), False,
                                   "a claim without its 16-byte token"),
    "a claim of a stream never handed out": (lambda: claim_frame(NEVER_HANDED_OUT, bytes(16)), False,
                                             f"a frame for stream {NEVER_HANDED_OUT}, which was never handed out"),
    "an engine call to a model not configured (the Python BLS)": (
        lambda: engine_request_frame(1, "tensorrt_llm_bls_python", "fuzz", [], {}), False,
        "an engine call to 'tensorrt_llm_bls_python', which is not one of the configured engine_models"),
    "an engine call to a model not configured (preprocessing)": (
        lambda: engine_request_frame(1, "preprocessing", "fuzz", [], {"QUERY": np.array([[b"hi"]], dtype=object)}),
        False, "an engine call to 'preprocessing'"),
    "an engine call to the relay's own model": (lambda: engine_request_frame(1, BLS, "fuzz", [], {}), False,
                                                f"an engine call to '{BLS}'"),
}


def test_the_socket_is_in_a_directory_only_the_servers_user_may_enter(socket_path, server):
    directory = Path(socket_path).parent
    status = directory.lstat()
    assert stat.S_ISDIR(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o700
    assert status.st_uid == os.geteuid()  # the server runs as this user
    assert stat.S_ISSOCK(Path(socket_path).lstat().st_mode)
    assert stat.S_IMODE((directory / "key").lstat().st_mode) == 0o600


def test_engine_calls_may_name_only_the_configured_engine(server):
    """make repo renders the repository's engines into the relay's config: here the target alone (no draft)."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{BLS}/config", timeout=10) as response:
        parameters = json.loads(response.read())["parameters"]
    assert parameters["engine_models"]["string_value"] == "tensorrt_llm"


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_connection_is_closed(socket_path, legit, case):
    make, end_input, _ = HOSTILE[case]
    assert legit.running(), "the legitimate stream ended before the hostile connections were done"
    assert _closed_by_the_relay(socket_path, make(), end_input), f"{case}: the relay kept the connection open"


def test_a_valid_token_does_not_take_a_stream_another_connection_claimed(socket_path, legit):
    """The server's own user can read the relay's key; a claim with the right token still cannot take a stream
    claimed elsewhere."""
    key = (Path(socket_path).parent / "key").read_bytes()
    assert legit.running()
    assert _closed_by_the_relay(socket_path, claim_frame(LEGIT_STREAM, stream_token(key, LEGIT_STREAM)))


def test_an_engine_call_to_a_configured_engine_is_served(socket_path):
    """The control for the cases above: the same kind of connection, sending what it may, is answered and kept."""
    request = engine_request_frame(3, "tensorrt_llm", "fuzz-control", OUTPUTS,
                                   engine_inputs([128000, 9906], 4, streaming=True))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(30)
        connection.connect(socket_path)
        connection.sendall(request)
        pending, kinds = b"", []
        while ENGINE_FINAL not in kinds:
            data = connection.recv(65536)
            assert data, "the relay closed a connection that sent a valid engine call"
            frames, pending = relay_frames(pending + data)
            kinds += [kind for stream, kind, _ in frames if stream == 3]
        assert kinds.count(ENGINE_RESPONSE) + kinds.count(ENGINE_FINAL) >= 4


def test_a_client_cannot_make_the_python_bls_claim_a_stream(server, socket_path, legit):
    """A client may call tensorrt_llm_bls_python directly, with any request parameters (Triton's generate endpoint
    makes parameters of the fields that are not inputs): relay parameters the relay did not write are refused there
    (the token is checked against the relay's key), never presented to the relay on the process's connection, which
    would close it and end every stream of that process."""
    forged = {"text_input": "hijack", "max_tokens": 4, "llama3_relay_socket": socket_path,
              "llama3_relay_stream": LEGIT_STREAM, "llama3_relay_token": "00" * 16}
    assert legit.running()
    with pytest.raises(HttpError) as error:
        generate(server.http_url, "tensorrt_llm_bls_python", forged)
    assert BLS in error.value.message and "Traceback" not in error.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_a_peer_of_another_user_is_refused_even_if_the_directory_were_open(socket_path, server):
    """The directory keeps other users out; were its mode ever lost, the relay's peer check still refuses them."""
    directory = Path(socket_path).parent
    os.chmod(directory, 0o755)
    os.chmod(socket_path, 0o777)
    try:
        child = os.fork()
        if child == 0:  # the child: another user, connecting; its exit status says what the relay did
            code = 3
            try:
                os.setgid(65534)
                os.setuid(65534)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
                    connection.settimeout(10)
                    connection.connect(socket_path)
                    code = 0 if connection.recv(1) == b"" else 1
            except OSError:
                code = 2
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
    finally:
        os.chmod(directory, 0o700)
    assert os.waitstatus_to_exitcode(status) == 0, "connected (2: could not; 1: the relay kept it open)"
    assert re.search(r"refused a connection to \S+ from pid \d+ \(uid 65534",
                     Path(server.log_path).read_text(errors="replace"))


def test_the_server_kept_serving_and_the_legitimate_stream_was_untouched(server, legit):
    legit.join()
    assert legit.error is None, legit.error
    final = legit.events[-1]
    assert final["finish_reason"] == "length" and final["num_output_tokens"] == LEGIT["max_tokens"]
    assert "injected" not in streamed_text(legit.events)
    assert streamed_text(legit.events) == generate(server.http_url, BLS, LEGIT)["text_output"]
    events = generate_stream(server.http_url, BLS, {"text_input": "After the fuzz", "max_tokens": 8, "end_id": -1,
                                                    "stream": True})
    assert events[-1]["num_output_tokens"] == 8
    assert server.is_alive()
    log = Path(server.log_path).read_text(errors="replace")
    closed = re.findall(r"closed the connection from pid (\d+)", log)
    assert len(closed) >= len(HOSTILE) + 1
    assert set(closed) == {str(os.getpid())}, "the relay closed a connection of the server's own processes"
    for case, (_, _, why) in HOSTILE.items():
        assert why is None or f"closed the connection from pid {os.getpid()}: {why}" in log, case
    assert "a claim of stream 1, which another connection claimed" in log  # the valid token's case
