"""The server the integration tests talk to: started here on free ports, or given by --server-url.

Against a running server (--server-url, e.g. `make test SERVER_URL=... REPO=...` in the 26.07 container) two kinds of
test cannot run, and are skipped by name with the reason: those that start a tritonserver of their own on a repository
they build here from build/assets (STARTS_ITS_OWN_SERVER), and, when the served tensorrt_llm is not the embedded engine
(backend python), those that need it (NEEDS_EMBEDDED_ENGINE). Everything else runs against the server as it is.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine_build.pbtxt import first, parse_pbtxt
from engine_build.pbtxt import parameters as pbtxt_parameters
from engine_build.repository import RepositorySettings, assemble_repository, repository_tokenizer
from serving.tritonserver import TritonServer, is_ready

ASSETS = Path(__file__).resolve().parents[2] / "build" / "assets"


@dataclass(frozen=True)
class Endpoint:
    http: str  # host:port
    grpc: str
    metrics: str  # full URL of the Prometheus endpoint

    def model_config(self, model: str) -> dict:
        with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/config", timeout=10) as response:
            return json.loads(response.read())

    def model_parameter(self, model: str, key: str) -> str | None:
        value = self.model_config(model).get("parameters", {}).get(key)
        return None if value is None else value["string_value"]

    def has_model(self, model: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http}/v2/models/{model}/ready", timeout=10) as response:
                return response.status == 200
        except OSError:
            return False

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics, timeout=10) as response:
            return response.read().decode()


def _parse_url(url: str) -> Endpoint:
    host, _, ports = url.partition(":")
    http, _, grpc = (ports or "8000").partition(",")
    grpc = grpc or str(int(http) + 1)
    return Endpoint(f"{host}:{http}", f"{host}:{grpc}", f"http://{host}:{int(http) + 2}/metrics")


@pytest.fixture(scope="session")
def endpoint(request, repo_dir, tmp_path_factory):
    url = request.config.getoption("--server-url")
    if url:
        endpoint = _parse_url(url)
        if not is_ready(endpoint.http):
            pytest.exit(f"--server-url {url}: server is not ready at http://{endpoint.http}", returncode=2)
        yield endpoint
        return
    if not (repo_dir / "ensemble").is_dir():
        pytest.exit(f"{repo_dir} is not a built model repository: run `make repo`", returncode=2)
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    with TritonServer(repo_dir, log_path=log) as server:
        yield Endpoint(server.http_url, server.grpc_url, server.metrics_url)
        assert server.is_alive(), f"tritonserver died during the tests; see {log}"


@pytest.fixture(scope="session")
def tokenizer_dir(endpoint, repo_dir):
    """The tokenizer the server under test uses: the one its repository ships (--repo: the served repository,
    also with --server-url)."""
    tokenizer = repository_tokenizer(repo_dir)
    if not tokenizer.is_dir():
        pytest.exit(f"{tokenizer} is missing: give --repo the repository the server serves", returncode=2)
    return tokenizer


@pytest.fixture(scope="session")
def served_checkpoint(endpoint, repo_dir) -> Path:
    """The checkpoint folder tensorrt_llm serves (the tests that compare with transformers load it): the embedded
    engine's `checkpoint_dir` parameter, or, on the LLM API (its `llm` parameter), model.yaml's `model`; both
    relative to the model's version folder."""
    version_dir = repo_dir / "tensorrt_llm" / "1"
    checkpoint = endpoint.model_parameter("tensorrt_llm", "checkpoint_dir")
    if checkpoint is None and endpoint.model_parameter("tensorrt_llm", "llm") is not None:
        from llmapi_engine.model_config import read_model_config

        return Path(read_model_config(version_dir).llm_args["model"])
    return version_dir / checkpoint


def assembled_repository(tmp_path_factory, name: str, **settings) -> Path:
    """A repository assembled here from build/assets (the tokenizer, the tiny target) on the embedded engine, with
    RepositorySettings fields overridden; the test is skipped where `make repo` has not made the assets."""
    if not (ASSETS / "tokenizer" / "tokenizer.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    return assemble_repository(tmp_path_factory.mktemp(name) / "repo", RepositorySettings(
        engine="embedded", tokenizer_dir=ASSETS / "tokenizer", target=ASSETS / "tiny-target-awq", **settings))


@contextmanager
def built_repository_server(request, tmp_path_factory, name: str, then: Callable[[Path], Path] = lambda repo: repo,
                            **settings) -> Iterator[TritonServer]:
    """tritonserver on assembled_repository(name, **settings) with `then` applied to it: for tests of build-time
    settings, which --server-url cannot serve."""
    repo = then(assembled_repository(tmp_path_factory, name, **settings))
    with TritonServer(repo, log_path=tmp_path_factory.mktemp("log") / "tritonserver.log") as server:
        yield server


@contextmanager
def built_llmapi_repository_server(request, tmp_path_factory, name: str, *repo_args: str) -> Iterator[TritonServer]:
    """tritonserver on an LLM API stand-in repository built here as `make repo ENGINE=llmapi` builds it (from
    build/assets; `repo_args`: more `python -m engine_build repo` options, e.g. --lora-dir)."""
    from engine_build.cli import main as engine_build

    if not (ASSETS / "tokenizer" / "tokenizer.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    repo = tmp_path_factory.mktemp(name) / "repo"
    assert engine_build(["repo", "--engine", "llmapi", "--repo", str(repo), "--assets", str(ASSETS), *repo_args]) == 0
    with TritonServer(repo, log_path=tmp_path_factory.mktemp("log") / "tritonserver.log") as server:
        yield server


STARTS_ITS_OWN_SERVER = {
    "test_faults.py": "kills model processes and shrinks /dev/shm of a server it starts on the synthetic embedded "
                      "engine it builds from build/assets",
    "test_unary.py": "starts a server on a DECOUPLED=false repository it builds from build/assets",
    "test_stream_interval.py": "starts a server on a STREAM_INTERVAL=4 repository it builds from build/assets",
    "test_engine_relay.py": "starts a server on the benchmark's relayed synthetic engine",
    "test_bench_engine.py": "starts a server on the benchmark's C++ engine it builds from build/assets",
    "test_handoff.py": "starts a server on a repository with the ensemble's handoff it builds from build/assets",
    "test_metrics_handoff.py": "starts a server on a repository with the ensemble's handoff (where its metrics are "
                               "measured) it builds from build/assets",
    "test_relocation.py": "copies the built repository elsewhere and serves the copy itself",
    "test_object_store.py": "serves a unary (DECOUPLED=false) repository it builds from build/assets from a local S3 "
                            "server",
    "test_server_exit.py":
        "kills a tritonserver it starts on the synthetic embedded engine it builds from build/assets",
    "test_lora.py":
        "starts a server on a LORA_DIR repository (adapters it makes with peft) it builds from build/assets",
    "test_relay_fuzz.py": "starts a server on the synthetic embedded engine it builds from build/assets",
}
NEEDS_EMBEDDED_ENGINE = {
    "test_embedded_engine_exports_the_tensorrtllm_backend_families": "its nv_trt_llm_* values are the embedded "
                                                                     "engine's (the C++ backend's differ: KV blocks)",
    "test_the_kv_cache_and_request_gauges_follow_a_running_generation": "times a generation of the embedded engine",
    "test_client_disconnect_stops_the_engine": "watches the embedded engine's embedded_engine_* metrics",
    "test_what_the_engine_cannot_do_is_refused_by_name": "checks the embedded engine's refusals",
    "test_greedy_equals_transformers_generate": "compares with transformers on the embedded engine's checkpoint",
    "test_end_id_stops_generation_and_is_not_returned":
        "compares with transformers on the embedded engine's checkpoint",
    "test_stop_words_list_stops_after_the_word": "compares with transformers on the embedded engine's checkpoint",
    "test_draft_tokens_are_verified": "compares with transformers on the embedded engine's checkpoint",
    "test_client_cancellation_stops_the_engine": "watches the embedded engine's embedded_engine_* metrics",
    "test_the_ensemble_refuses_non_finite_sampling_floats_by_name": "the ensemble passes them to tensorrt_llm as they "
                                                                   "come: the embedded engine's checks answer",
    "test_the_ensemble_refuses_a_deeply_nested_schema_by_name": "the ensemble passes the guide to tensorrt_llm as it "
                                                                "comes: the embedded engine's check answers",
    # Exact equality of speculative and plain greedy output holds where verifying k draft tokens computes the same
    # logits as k plain steps: the embedded engine's float32 CPU arithmetic. On a GPU the batched verification's
    # kernels round differently, and a near-tie can flip a token (TensorRT-LLM promises no bitwise equality).
    "test_speculative_equals_plain_greedy": "needs verification's logits bitwise equal to plain decoding's",
    "test_speculative_with_batch_of_two": "needs verification's logits bitwise equal to plain decoding's",
    "test_draft_tokens_that_break_the_grammar_do_not_change_greedy_output": "needs verification's logits bitwise "
                                                                            "equal to plain decoding's",
}


# Tests of what the LLM API flow's tensorrt_llm (the llmapi repositories: its `llm` parameter) does not have, skipped
# there by name (a test's, or a module's). Its stand-in runs the embedded engine, so the transformers comparisons
# above still run on it. Of the modules that start a server of their own (STARTS_ITS_OWN_SERVER), test_lora.py builds
# the flow --repo has and test_relocation.py serves a copy of --repo: both run on it; the others build an embedded
# engine's repository whatever --repo is, which the default pass (`make test`) serves, and are skipped here.
_OWN_EMBEDDED_SERVER = "builds and serves an embedded engine's repository of its own whatever --repo is (the default " \
                       "pass runs it; no LLM API model in it)"
NOT_ON_LLMAPI = {
    **{module: _OWN_EMBEDDED_SERVER for module in STARTS_ITS_OWN_SERVER
       if module not in ("test_lora.py", "test_relocation.py")},
    "test_draft_tokens_are_verified": "1.2.x's LLM API takes no draft tokens per request (draft_input_ids is refused "
                                      "by name there)",
    "test_speculative_equals_plain_greedy": "draft-target rounds send draft_input_ids, which 1.2.x's LLM API does not "
                                            "take (refused by name)",
    "test_speculative_with_batch_of_two": "draft-target rounds send draft_input_ids, which 1.2.x's LLM API does not "
                                          "take (refused by name)",
    "test_draft_tokens_that_break_the_grammar_do_not_change_greedy_output": "draft-target rounds send "
                                                                            "draft_input_ids (refused by name)",
    "test_client_cancellation_stops_the_engine": "watches the embedded engine's embedded_engine_* metrics (the llmapi "
                                                 "model's own: test_llmapi.py)",
    "test_client_disconnect_stops_the_engine": "watches the embedded engine's embedded_engine_* metrics (the llmapi "
                                               "model's own: test_llmapi.py)",
    "test_what_the_engine_cannot_do_is_refused_by_name": "checks the embedded engine's refusals (the llmapi model's "
                                                         "own: tests/unit/test_llmapi_request_mapping.py)",
}


def served_engine_parameters(config) -> dict[str, str]:
    """The model parameters of the tensorrt_llm under test (as served_engine_backend finds its config)."""
    url = config.getoption("--server-url")
    if url:
        try:
            served = _parse_url(url).model_config("tensorrt_llm").get("parameters", {})
        except OSError as error:
            raise pytest.UsageError(f"--server-url {url}: cannot read tensorrt_llm's config ({error})") from None
        return {key: value["string_value"] for key, value in served.items()}
    engine_config = Path(config.getoption("--repo")) / "tensorrt_llm" / "config.pbtxt"
    return pbtxt_parameters(parse_pbtxt(engine_config.read_text())) if engine_config.is_file() else {}


def served_engine_backend(config) -> str | None:
    """The backend of the tensorrt_llm under test (python: the embedded engine): the running server's (--server-url)
    or the repository's the tests serve (--repo); None where neither says."""
    url = config.getoption("--server-url")
    if url:
        try:
            return _parse_url(url).model_config("tensorrt_llm").get("backend")
        except OSError as error:  # never a silent skip of every test that needs to know
            raise pytest.UsageError(f"--server-url {url}: cannot read tensorrt_llm's config ({error})") from None
    engine_config = Path(config.getoption("--repo")) / "tensorrt_llm" / "config.pbtxt"
    return first(parse_pbtxt(engine_config.read_text()), "backend") if engine_config.is_file() else None


def pytest_collection_modifyitems(config, items):
    url = config.getoption("--server-url")
    backend = served_engine_backend(config)
    llm = served_engine_parameters(config).get("llm")
    for item in items:
        if "integration" not in str(item.fspath):
            continue
        item.add_marker(pytest.mark.integration)
        module = item.fspath.basename
        if url and module in STARTS_ITS_OWN_SERVER:
            item.add_marker(pytest.mark.skip(reason=f"--server-url: {module} {STARTS_ITS_OWN_SERVER[module]}"))
        elif llm is not None and (module in NOT_ON_LLMAPI or item.originalname in NOT_ON_LLMAPI):
            name = module if module in NOT_ON_LLMAPI else item.originalname
            item.add_marker(pytest.mark.skip(reason=f"tensorrt_llm runs the LLM API ({llm}): {name} "
                                                    f"{NOT_ON_LLMAPI[name]}"))
        elif item.originalname in NEEDS_EMBEDDED_ENGINE and backend != "python":
            item.add_marker(pytest.mark.skip(reason=f"tensorrt_llm is backend {backend}, not the embedded engine: "
                                                    f"{item.originalname} {NEEDS_EMBEDDED_ENGINE[item.originalname]}"))


# ---- No crash the suite did not cause on purpose ---------------------------------------------------------------------
# What a tritonserver log shows when one of its processes crashed: tritonserver's handler for SIGSEGV / SIGABRT
# (server src/triton_signal.cc: "Signal (11) received.", a stack trace, then the core dump), what a stub prints on its
# way down (its stderr is the log: glibc's heap checks, C++'s terminate, Python's fatal errors), a shell's report, and
# Triton's word for a stub that has died ("Stub process '<instance>' is not healthy.").
CRASH_SIGNS = (
    "Signal (11) received", "Signal (6) received", "Segmentation fault", "core dumped", "Fatal Python error",
    "double free or corruption", "corrupted size vs", "corrupted double-linked list", "malloc(): ", "free(): invalid",
    "munmap_chunk(): invalid pointer", "terminate called", "is not healthy",
)
# Tests that kill or crash a process on purpose (by test id), and the signs that leaves in their server's log.
CRASHES_ON_PURPOSE = {
    "test_killed_engine_stub": ("is not healthy",),
    "test_killed_bls_stub_behind_the_relay_ends_its_streams": ("is not healthy",),
    # A stub whose server is killed mid-call may die on the server's shared memory itself (Triton's stub:
    # "terminate called after throwing ... boost::interprocess::lock_exception"): a consequence of the kill.
    "test_every_stub_exits_when_tritonserver_ends[SIGKILL]": ("terminate called",),
    "test_every_stub_exits_when_tritonserver_ends[SIGSEGV]": ("Signal (11) received", "terminate called"),
}


class ServerLogs:
    """Every log the tests' servers write (under pytest's base temp: TritonServer(log_path=tmp_path...)), read on from
    where the previous look stopped."""

    def __init__(self, root: Path):
        self._root = root
        self._read_to: dict[Path, int] = {}

    def crash_lines(self) -> list[str]:
        """The complete lines written since the last call that show a crash, each with its log's path."""
        found = []
        for log in sorted(self._root.rglob("*.log")):
            start = self._read_to.get(log, 0)
            with open(log, "rb") as file:
                file.seek(start)
                text = file.read()
            complete = text[: text.rfind(b"\n") + 1]
            self._read_to[log] = start + len(complete)
            found += [f"{log}: {line}" for line in complete.decode(errors="replace").splitlines()
                      if any(sign in line for sign in CRASH_SIGNS)]
        return found


@pytest.fixture(scope="session", autouse=True)
def server_logs(tmp_path_factory) -> Iterator[ServerLogs]:
    """Set up before any server fixture, so checked after the last has stopped: what the servers logged at their
    shutdown, after the last test's own check."""
    logs = ServerLogs(tmp_path_factory.getbasetemp())
    yield logs
    unexpected = logs.crash_lines()
    assert not unexpected, "a server crashed at or after the end of the tests:\n" + "\n".join(unexpected)


@pytest.fixture(autouse=True)
def no_unexpected_crash(request, server_logs: ServerLogs) -> Iterator[None]:
    """After each test: no server logged a crash it did not cause on purpose (CRASHES_ON_PURPOSE)."""
    yield
    expected = CRASHES_ON_PURPOSE.get(request.node.name, ())
    unexpected = [line for line in server_logs.crash_lines() if not any(sign in line for sign in expected)]
    assert not unexpected, f"a server crashed during {request.node.name}:\n" + "\n".join(unexpected)
