"""Faults: what clients and operators see when something breaks, each against a short-lived server of its own.

The servers serve a synthetic-engine variant of the repository (no draft, no model weights: quick to
start) built under tmp, so the session server of the other integration tests is never touched. What each
test asserts is what Triton 2.51 + this repository actually do; docs/operations.md explains the findings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from serving.tritonserver import TritonServer, exit_timeout_s, server_command, server_environment
from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream
from testkit.metrics import metric_values
from testkit.openai_api import openai_api
from testkit.processes import stub_process
from tests.integration.conftest import assembled_repository

BLS = "tensorrt_llm_bls"
ENGINE = "tensorrt_llm"
# A client that sees no event for this long counts as hung; generous for a loaded 2-core box.
HUNG_AFTER_S = 10.0
# Sampling (top_k 50) with frequency_penalty -3e38: the first token is normal, the second repeats it
# (+3e38 is still a finite float32), the third overflows to +inf and torch.multinomial raises inside the
# engine thread. A legitimate input that makes the engine fail mid-generation, without any test hook.
ENGINE_FAILS_AT_THIRD_TOKEN = {"frequency_penalty": -3e38, "top_k": 50, "end_id": -1}


def _synthetic_repository(tmp_path_factory, **overrides) -> Path:
    return assembled_repository(tmp_path_factory, "faults", synthetic=True, **overrides)


@pytest.fixture(scope="module")
def synthetic_repo(tmp_path_factory) -> Path:
    return _synthetic_repository(tmp_path_factory)


@pytest.fixture(scope="module")
def paced_repo(tmp_path_factory) -> Path:
    """The synthetic engine at 5 ms a step: a 4,000-token stream runs 20 s, so a fault injected once it has started
    lands in the middle of it on any host (unpaced, a fast host generated all of it in under a second)."""
    return _synthetic_repository(tmp_path_factory, step_ms=5.0)


@pytest.fixture(scope="module")
def server(synthetic_repo, tmp_path_factory):
    """One server for the faults that must leave it serving (engine error, huge input)."""
    with TritonServer(synthetic_repo, log_path=tmp_path_factory.mktemp("log") / "tritonserver.log") as server:
        yield server


def http_status(http_url: str, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{http_url}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def stub_pid(server: TritonServer, model: str) -> int:
    """The Python backend stub of `model`'s first instance."""
    return stub_process(server.process.pid, f"{model}_0_0").pid


def still_serves(server: TritonServer) -> bool:
    return generate(server.http_url, BLS, {"text_input": "still there?", "max_tokens": 3})["num_output_tokens"] == 3


class BackgroundStream:
    """A streaming request on a thread, so the test can break something while it runs."""

    def __init__(self, run: Callable[[], object]):
        self.result: object = None
        self._thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self._thread.start()

    def _run(self, run: Callable[[], object]) -> None:
        try:
            self.result = run()
        except Exception as error:  # noqa: BLE001 - the outcome is what the test inspects
            self.result = error

    def join(self, timeout: float) -> bool:
        """True when the request ended (with data or an error) within `timeout`."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


def engine_sequences(server: TritonServer) -> float:
    """Sequences the engine holds, running or queued (the gauges are updated at submit and at finish)."""
    return sum(metric_values(server.metrics_url, f"embedded_engine_{state}_sequences").get(ENGINE, 0)
               for state in ("active", "queued"))


def wait_engine_idle(server: TritonServer, timeout_s: float = 2.0) -> None:
    """The engine holds no sequence, as its gauges say once published (they go to Triton every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while engine_sequences(server) != 0:
        assert time.monotonic() < deadline, f"the engine still holds {engine_sequences(server)} sequences"
        time.sleep(0.05)


def wait_engine_sequences(server: TritonServer, count: int, timeout_s: float = HUNG_AFTER_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if engine_sequences(server) >= count:
                return
        except OSError:  # tritonserver opens its metrics port ~40 ms after the HTTP port that said it was ready
            pass
        assert time.monotonic() < deadline, f"the engine never ran {count} sequences"
        time.sleep(0.05)


# ---- (a) the engine's stub process is killed mid-request ------------------------------------------------

def test_killed_engine_stub(paced_repo, tmp_path):
    """kill -9 of tensorrt_llm's stub while a BLS stream runs through it."""
    explicit = ("--model-control-mode=explicit", "--load-model=*")  # allows reloading one model
    with TritonServer(paced_repo, log_path=tmp_path / "tritonserver.log", extra_args=explicit) as server:
        stream = BackgroundStream(lambda: generate_stream(server.http_url, BLS, {
            "text_input": "tell me", "max_tokens": 4000, "end_id": -1, "stream": True}, timeout=HUNG_AFTER_S))
        wait_engine_sequences(server, 1)  # it is generating (4000 tokens: 20 s): kill the engine under it
        os.kill(stub_pid(server, ENGINE), signal.SIGKILL)

        # The in-flight request is never told: no error, no final response; the client runs into its own
        # read timeout: the dead stub never completes the engine request the BLS made (through the relay, or by exec
        # and its response iterator), and Triton does not complete it for it. If Triton
        # starts delivering an error here, this fails: update docs/operations.md.
        assert stream.join(HUNG_AFTER_S + 10)
        aborted = not server.is_alive()
        if aborted and "boost::interprocess::lock_exception" in (tmp_path / "tritonserver.log").read_text():
            # Seen once in CI (2026-11-23): the stub died in the middle of a response send and tritonserver aborted
            # with it (an exception escaping libtriton_python's ResponseSendDecoupled; docs/operations.md). Triton's
            # behaviour, not ours, and not what this test is about: reported, not passed.
            pytest.xfail("tritonserver aborted (Triton 2.51 libtriton_python lock_exception as the stub died mid-send)")
        assert isinstance(stream.result, TimeoutError)

        # The server stays up and keeps reporting itself and the model healthy; nothing restarts the stub.
        assert server.is_alive()
        for path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{ENGINE}/ready"):
            assert http_status(server.http_url, path) == 200, path
        # Every new request fails fast with an error naming the dead stub, whichever path it takes.
        with pytest.raises(HttpError, match=f"Stub process '{ENGINE}_0_0' is not healthy"):
            generate(server.http_url, BLS, {"text_input": "again", "max_tokens": 3})
        with pytest.raises(HttpError, match="is not healthy"):
            generate(server.http_url, "ensemble", {"text_input": "again", "max_tokens": 3})

        # Recovery without a restart: reload the one model through the repository API (explicit mode).
        request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/{ENGINE}/load",
                                         data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
        assert still_serves(server)


def test_killed_bls_stub_behind_the_relay_ends_its_streams(paced_repo, tmp_path):
    """kill -9 of the Python BLS's stub while the relay streams its responses: Triton never tells the child request
    (as above), but the relay sees the stub's connection end and ends the stream with an error; the server stays."""
    if not (paced_repo / "tensorrt_llm_bls_python").is_dir():
        pytest.skip("built without the relay (no C++ compiler)")
    with TritonServer(paced_repo, log_path=tmp_path / "tritonserver.log") as server:
        stream = BackgroundStream(lambda: generate_stream(server.http_url, BLS, {
            "text_input": "tell me", "max_tokens": 4000, "end_id": -1, "stream": True}, timeout=HUNG_AFTER_S))
        wait_engine_sequences(server, 1)
        time.sleep(0.2)  # some tokens have gone out through the relay
        os.kill(stub_pid(server, "tensorrt_llm_bls_python"), signal.SIGKILL)
        assert stream.join(HUNG_AFTER_S + 10)
        assert isinstance(stream.result, HttpError), stream.result
        assert "tensorrt_llm_bls_python's process stopped sending this stream" in stream.result.message
        assert server.is_alive() and http_status(server.http_url, "/v2/health/live") == 200
        assert ("the connection from tensorrt_llm_bls_python ended with 1 streams unfinished; they ended with an "
                "error") in (tmp_path / "tritonserver.log").read_text()


# ---- (b) the engine raises mid-generation ------------------------------------------------------------------

def test_engine_error_mid_generation_reaches_direct_and_ensemble_clients(server):
    inputs = {"input_ids": np.array([[791, 4062]], dtype=np.int32), "input_lengths": np.array([[2]], np.int32),
              "request_output_len": np.array([[10]], np.int32), "streaming": np.array([[True]]),
              "frequency_penalty": np.array([[-3e38]], np.float32), "runtime_top_k": np.array([[50]], np.int32)}
    direct = grpc_stream(server.grpc_url, ENGINE, inputs, ["output_ids"], timeout=HUNG_AFTER_S)
    assert len(direct.responses) == 2  # the tokens before the failure were delivered
    assert "internal error (RuntimeError: probability tensor contains" in direct.error
    assert "Traceback" not in direct.error
    with pytest.raises(HttpError, match="in ensemble 'ensemble', tensorrt_llm: internal error"):
        generate_stream(server.http_url, "ensemble", {"text_input": "hi", "max_tokens": 10, "stream": True,
                                                      **ENGINE_FAILS_AT_THIRD_TOKEN}, timeout=HUNG_AFTER_S)
    assert server.is_alive() and still_serves(server)


def _assert_engine_error_reaches_bls_clients(server: TritonServer) -> None:
    """An engine error after data responses ends the BLS client's stream with it: never a stream that just ends,
    as if complete, with part of the text."""
    with pytest.raises(HttpError, match="tensorrt_llm: internal error") as error:
        generate_stream(server.http_url, BLS, {"text_input": "hi", "max_tokens": 10, "stream": True,
                                               **ENGINE_FAILS_AT_THIRD_TOKEN}, timeout=HUNG_AFTER_S)
    assert "Traceback" not in error.value.message
    assert server.is_alive() and still_serves(server)


def test_engine_error_mid_generation_reaches_bls_clients(server):
    """Relayed: the relay writes the engine's error back as a frame with its code."""
    _assert_engine_error_reaches_bls_clients(server)


def _in_flight_at_shutdown(server: TritonServer) -> list[str]:
    """The models tritonserver still counted as in flight when it was stopped (from its shutdown log)."""
    log = server.log_path.read_text()
    assert "Waiting for in-flight requests to complete" in log  # the shutdown did look
    return [line.split("] ", 1)[-1] for line in log.splitlines() if "has " in line and " in-flight inferences" in line]


def test_engine_errors_leave_nothing_in_flight(synthetic_repo, tmp_path):
    """An engine error ends its stream in one response. Sent apart from the FINAL flag, Triton 2.51's ensemble
    counted each such request as in flight forever, and shutdown waited out --exit-timeout-secs."""
    server = TritonServer(synthetic_repo, log_path=tmp_path / "tritonserver.log")
    with server:
        with pytest.raises(HttpError, match="exceeds the engine's max_seq_len"):  # before any token
            generate(server.http_url, "ensemble", {"text_input": "hi", "max_tokens": 100_000}, timeout=HUNG_AFTER_S)
        with pytest.raises(HttpError, match="internal error"):  # after two tokens
            generate_stream(server.http_url, BLS, {"text_input": "hi", "max_tokens": 10, "stream": True,
                                                   **ENGINE_FAILS_AT_THIRD_TOKEN}, timeout=HUNG_AFTER_S)
    assert _in_flight_at_shutdown(server) == []


def test_an_ensemble_stream_failing_mid_generation_is_released(synthetic_repo, tmp_path):
    """The engine fails after two tokens while the ensemble's postprocessing steps for them may still run.
    Triton 2.51's ensemble then keeps the request in flight forever when a step completes after the failure: it
    stopped processing completed steps once failed, so its in-flight step count never reached 0 (fixed in Triton
    core #466, 2026-02, "Ensemble requests stuck indefinitely ...": the pinned 26.07 container has it). A race:
    about one run in four here. On 2.51 a leak is that known upstream failure; on any other server it fails."""
    server = TritonServer(synthetic_repo, log_path=tmp_path / "tritonserver.log")
    with server:
        with urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=5) as response:
            version = json.load(response)["version"]
        with pytest.raises(HttpError, match="in ensemble 'ensemble', tensorrt_llm: internal error"):
            generate_stream(server.http_url, "ensemble", {"text_input": "hi", "max_tokens": 10, "stream": True,
                                                          **ENGINE_FAILS_AT_THIRD_TOKEN}, timeout=HUNG_AFTER_S)
    leaked = _in_flight_at_shutdown(server)
    if leaked and version == "2.51.0":
        pytest.xfail(f"Triton 2.51 ensemble race (core #466): {leaked[0]}")
    assert leaked == []


def test_huge_input_is_refused_and_the_server_keeps_serving(server):
    huge = "many words " * (50_000_000 // len("many words "))  # ~50 MB
    with pytest.raises(HttpError) as error:
        generate(server.http_url, BLS, {"text_input": huge, "max_tokens": 2}, timeout=120)
    assert "max_input_len" in error.value.message and "Traceback" not in error.value.message
    assert server.is_alive() and still_serves(server)


# ---- (d) a small /dev/shm (Docker's default 64 MB) ---------------------------------------------------------

def test_small_dev_shm(synthetic_repo, tmp_path):
    """Triton in its own mount namespace with a 64 MB tmpfs on /dev/shm, as `docker run` without --shm-size."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount namespaces (unshare -m)")
    server = TritonServer(synthetic_repo, log_path=tmp_path / "tritonserver.log")
    server.exit_timeout_s = exit_timeout = exit_timeout_s(json.loads((synthetic_repo / "repository.json").read_text()))
    command = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"', "sh",
               *server_command(synthetic_repo, server.ports, address=server.address, exit_timeout=exit_timeout)]
    with open(server.log_path, "wb") as log:
        server.process = subprocess.Popen(command, env=server_environment(), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
    try:
        server.wait_ready()
        assert still_serves(server)  # small requests fit in the default 1 MiB regions
        with pytest.raises(HttpError) as error:
            generate(server.http_url, BLS, {"text_input": "x" * (40 << 20), "max_tokens": 2}, timeout=120)
        assert "--shm-size" in error.value.message and "No space left on device" in error.value.message
        assert server.is_alive() and still_serves(server)
    finally:
        server.stop()


# ---- overload and unload ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_engine_repo(tmp_path_factory) -> Path:
    """One sequence at a time and one waiting, at a GPU-like 50 ms a step: capacity is easy to exceed."""
    return assembled_repository(tmp_path_factory, "small", synthetic=True, max_active_requests=1,
                                max_queued_requests=1, step_ms=50)


def test_overload_is_answered_unavailable_at_once(small_engine_repo, tmp_path):
    """Beyond the engine's capacity the client gets an error naming the limits at once, while the admitted
    requests are served: never an unbounded wait, never a lost request.

    The models answer UNAVAILABLE; Triton's `generate` reads the status from the response's error after freeing
    it (server src/http_server.cc, r24.10 and r26.07), so it reports 400, whatever the code; the message is the
    contract (docs/operations.md)."""
    body = {"text_input": "tell me", "max_tokens": 40, "end_id": -1}
    with TritonServer(small_engine_repo, log_path=tmp_path / "tritonserver.log") as server:
        streams = [BackgroundStream(lambda: generate(server.http_url, BLS, body, timeout=60)) for _ in range(2)]
        wait_engine_sequences(server, 2)  # one generating, one waiting: full
        for model in (BLS, "ensemble"):
            with pytest.raises(HttpError) as refused:
                generate(server.http_url, model, body, timeout=60)
            assert refused.value.status in (400, 503) and "at capacity" in refused.value.message, model
        assert not any(stream.join(0) for stream in streams)  # refused while the admitted ones still run
        for stream in streams:
            assert stream.join(60) and stream.result["num_output_tokens"] == 40


def test_overload_reaches_openai_clients_as_503_with_retry_after(small_engine_repo, tmp_path):
    """The engine's queue limit, through the OpenAI API: 503 with Retry-After in OpenAI's error shape, streamed or
    not (a stream refused before its first event gets the status; after it, the error is its last event: the unit
    tests), never a 400; the admitted requests are served."""
    body = {"text_input": "tell me", "max_tokens": 40, "end_id": -1}
    chat = {"model": "llama3-test", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with TritonServer(small_engine_repo, log_path=tmp_path / "tritonserver.log") as server, \
            openai_api(server.grpc_url, tmp_path / "api.log", "--model-name", "llama3-test") as api:
        streams = [BackgroundStream(lambda: generate(server.http_url, BLS, body, timeout=60)) for _ in range(2)]
        wait_engine_sequences(server, 2)  # one generating, one waiting: full
        for stream in (False, True):
            refused = httpx.post(f"{api.v1}/chat/completions", json={**chat, "stream": stream}, timeout=60)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "1" and refused.headers["content-type"] == "application/json"
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "unavailable"), error
            assert "at capacity" in error["message"] and error["message"].endswith("retry later"), error
        for stream in streams:
            assert stream.join(60) and stream.result["num_output_tokens"] == 40
        assert 'llama3_api_request_errors_total{model="llama3-test",status="503"} 2.0' in \
            httpx.get(f"{api.url}/metrics").text


def test_unloading_lets_running_requests_finish_then_refuses(small_engine_repo, tmp_path):
    """Unload the BLS with one stream generating and one waiting in the engine. Triton 2.51 keeps a model
    whose requests still hold a response sender until they are answered, so both clients get their complete
    output (nothing is cut or lost); then the model goes away, later requests are refused with an error
    naming it, and the engine is idle."""
    explicit = ("--model-control-mode=explicit", "--load-model=*")
    body = {"text_input": "tell me", "max_tokens": 40, "end_id": -1, "stream": True}  # 2 s at 50 ms a token
    with TritonServer(small_engine_repo, log_path=tmp_path / "tritonserver.log", extra_args=explicit) as server:
        streams = [BackgroundStream(lambda: generate_stream(server.http_url, BLS, body, timeout=60)) for _ in range(2)]
        wait_engine_sequences(server, 2)
        unload = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/{BLS}/unload",
                                        data=b"{}", method="POST")
        with urllib.request.urlopen(unload, timeout=60) as response:
            assert response.status == 200
        for stream in streams:
            assert stream.join(30), "a client was left waiting by the unload"
            assert not isinstance(stream.result, Exception), stream.result
            assert stream.result[-1]["num_output_tokens"] == 40
        deadline = time.monotonic() + 30
        while http_status(server.http_url, f"/v2/models/{BLS}/ready") == 200:
            assert time.monotonic() < deadline, "the BLS did not unload once its requests were answered"
            time.sleep(0.1)
        with pytest.raises(HttpError) as refused:
            generate(server.http_url, BLS, {"text_input": "tell me", "max_tokens": 4}, timeout=30)
        assert BLS in refused.value.message
        wait_engine_idle(server)
        assert server.is_alive()
