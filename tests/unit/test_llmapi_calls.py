"""Every call the llmapi model makes to the LLM API matches TensorRT-LLM 1.2.x's recorded signatures
(tests/unit/upstream_llmapi.py): the runner (llmapi_engine/runner.py) drives a recording API whose calls are bound to
the recorded parameter lists (keywords only, where upstream's position could shift between versions) before they
reach the stand-in. Also the runner's streaming, cancellation and `stop` through it."""

import inspect
import threading
from pathlib import Path

import numpy as np
import pytest

from engine_build import upstream_llm_args
from llmapi_engine import stand_in
from llmapi_engine.llm_api import LlmApi, LlmApiUnavailable, load_llm_api
from llmapi_engine.model_config import LlmModelConfig
from llmapi_engine.request_mapping import map_request
from llmapi_engine.runner import LlmRunner
from tests.unit import upstream_llmapi as upstream

ASSETS = Path(__file__).resolve().parents[2] / "build" / "assets"
MODEL = ASSETS / "tiny-target-hf"


def signature(recorded):
    parameters = []
    for name, default in recorded:
        if name.startswith("**"):
            parameters.append(inspect.Parameter(name[2:], inspect.Parameter.VAR_KEYWORD))
        else:
            parameters.append(inspect.Parameter(
                name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if default is upstream.REQUIRED else default))
    return inspect.Signature(parameters)


CALLS: list[tuple[str, dict]] = []


class RecordingLLM:
    def __init__(self, *args, **kwargs):
        assert not args, "LLM() is called by keyword"
        bound = signature(upstream.LLM_INIT).bind(**kwargs)
        assert set(bound.arguments.get("kwargs", {})) <= {arg.name for arg in upstream_llm_args.TORCH_LLM_ARGS}
        CALLS.append(("LLM", kwargs))
        self._llm = stand_in.LLM(**kwargs)

    def generate_async(self, inputs, *args, **kwargs):
        assert not args, "generate_async's arguments after the prompt are passed by keyword"
        signature(upstream.GENERATE_ASYNC).bind(inputs, **kwargs)
        assert isinstance(inputs, list) and all(isinstance(t, int) for t in inputs), "prompts are token ids"
        CALLS.append(("generate_async", kwargs))
        return self._llm.generate_async(inputs, **kwargs)

    def get_stats_async(self, *args, **kwargs):
        signature(upstream.GET_STATS_ASYNC).bind(*args, **kwargs)
        return self._llm.get_stats_async(*args, **kwargs)

    def shutdown(self, *args, **kwargs):
        signature(upstream.SHUTDOWN).bind(*args, **kwargs)
        self._llm.shutdown()


def recording_sampling_params(**kwargs):
    signature(upstream.SAMPLING_PARAMS).bind(**kwargs)
    CALLS.append(("SamplingParams", kwargs))
    return stand_in.SamplingParams(**kwargs)


def recording_guided(**kwargs):
    signature(upstream.GUIDED_DECODING_PARAMS).bind(**kwargs)
    return stand_in.GuidedDecodingParams(**kwargs)


def recording_lora_request(**kwargs):
    signature(upstream.LORA_REQUEST).bind(**kwargs)
    CALLS.append(("LoRARequest", kwargs))
    return stand_in.LoRARequest(**kwargs)


API = LlmApi("stand_in", RecordingLLM, recording_sampling_params, recording_guided, recording_lora_request,
             stand_in.update_llm_args_with_extra_dict)


class Sender:
    def __init__(self):
        self.responses, self.error, self.done = [], None, threading.Event()

    def send(self, outputs, final=False):
        self.responses.append(dict(outputs))
        if final:
            self.done.set()

    def send_error(self, error):
        self.error = error
        self.done.set()

    def finish(self):
        self.done.set()

    def wait(self):
        assert self.done.wait(60)
        return self


@pytest.fixture(scope="module")
def runner(bundle):
    if not (MODEL / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    config = LlmModelConfig({"model": str(MODEL), "max_batch_size": 4, "enable_iter_perf_stats": True,
                             "guided_decoding_backend": "xgrammar",
                             "speculative_config": {"decoding_type": "NGram", "max_draft_len": 3,
                                                    "max_matching_ngram_size": 2}},
                            decoupled=True, cancellation_check_period_ms=20)
    stats = []
    runner = LlmRunner(API, config, bundle, on_stats=stats.append)
    runner.stats = stats
    yield runner
    runner.shutdown()


def contract(prompt, max_tokens, **extra):
    inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
              "request_output_len": np.array([max_tokens], np.int32)}
    inputs.update({name: np.array([value]) for name, value in extra.items()})
    return inputs


def run(runner, bundle, inputs, request_id="r", is_cancelled=lambda: False):
    sender = Sender()
    runner.submit(request_id, map_request(inputs, bundle, bundle.vocab_size, 4096, True, {}), sender, is_cancelled)
    return sender


PROMPT = [128000, 9906, 1917, 11, 358, 1097]


def test_every_call_matches_the_recorded_signatures(runner, bundle):
    CALLS.clear()
    for extra in ({}, {"streaming": True, "return_log_probs": True}, {"temperature": np.float32(0.7),
                                                                      "runtime_top_k": np.int32(4)}):
        run(runner, bundle, contract(PROMPT, 5, **extra)).wait()
    guided = contract(PROMPT, 20, guided_decoding_guide_type=np.array([b"json"], object))
    run(runner, bundle, guided).wait()
    text = {"text_input": np.array([[b"Hi there"]], object), "sampling_param_max_tokens": np.array([[4]], np.int32)}
    run(runner, bundle, text).wait()
    kinds = [kind for kind, _ in CALLS]
    assert kinds.count("generate_async") == 5 and kinds.count("SamplingParams") == 5
    assert all(set(kwargs) == {"sampling_params", "lora_request", "streaming"} and kwargs["lora_request"] is None
               for kind, kwargs in CALLS if kind == "generate_async")


def test_streaming_sends_one_response_per_step_and_equals_unstreamed(runner, bundle):
    streamed = run(runner, bundle, contract(PROMPT, 6, streaming=True, end_id=np.int32(-1))).wait()
    unstreamed = run(runner, bundle, contract(PROMPT, 6, end_id=np.int32(-1))).wait()
    assert len(streamed.responses) >= 2
    tokens = [t for r in streamed.responses for t in r["output_ids"].reshape(-1).tolist()]
    assert tokens == unstreamed.responses[0]["output_ids"].reshape(-1).tolist() and len(tokens) == 6


def test_a_streamed_response_carries_the_log_probs_of_every_token_so_far(runner, bundle):
    """The C++ backend's contract (llmRequest.cpp LlmRequest::createResult: `result.logProbs = getLogProbs()`): the
    LLM API's cumulative CompletionOutput.logprobs, not logprobs_diff, in each streamed response."""
    streamed = run(runner, bundle, contract(PROMPT, 6, streaming=True, end_id=np.int32(-1),
                                            return_log_probs=True)).wait()
    unstreamed = run(runner, bundle, contract(PROMPT, 6, end_id=np.int32(-1), return_log_probs=True)).wait()
    expected = unstreamed.responses[0]["output_log_probs"].reshape(-1)
    assert expected.shape == (6,)
    so_far = 0
    for response in streamed.responses:
        so_far += response["output_ids"].size
        log_probs = response["output_log_probs"].reshape(-1)
        assert log_probs.shape == (so_far,)
        np.testing.assert_allclose(log_probs, expected[:so_far], atol=1e-5)
        assert response["cum_log_probs"].item() == pytest.approx(float(log_probs.sum()), abs=1e-4)
    assert so_far == 6


def test_a_cancelled_client_aborts_its_request(runner, bundle):
    cancelled = threading.Event()
    sender = Sender()
    seen = []

    def send(outputs, final=False):
        seen.append(outputs)
        if len(seen) == 2:
            cancelled.set()
        Sender.send(sender, outputs, final)

    sender.send = send
    runner.submit("c", map_request(contract(PROMPT, 2000, streaming=True, end_id=np.int32(-1)), bundle,
                                   bundle.vocab_size, 4096, True, {}), sender, cancelled.is_set)
    sender.wait()
    assert sender.error is None and 2 <= len(seen) < 2000


def test_stop_aborts_the_request_with_that_id(runner, bundle):
    sender = Sender()
    started = threading.Event()
    original = sender.send

    def send(outputs, final=False):
        started.set()
        original(outputs, final)

    sender.send = send
    runner.submit("to-stop", map_request(contract(PROMPT, 2000, streaming=True, end_id=np.int32(-1)), bundle,
                                         bundle.vocab_size, 4096, True, {}), sender, lambda: False)
    assert started.wait(60)
    assert runner.stop("to-stop") == 1
    sender.wait()
    assert sum(r["output_ids"].size for r in sender.responses) < 2000


def test_iteration_stats_reach_the_metrics_callback(runner, bundle):
    import time

    run(runner, bundle, contract(PROMPT, 3)).wait()
    deadline = time.monotonic() + 10
    while not runner.stats and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runner.stats and "numActiveRequests" in runner.stats[-1]


def test_refused_sampling_is_an_invalid_argument_naming_the_call(runner, bundle):
    from bls.errors import InvalidRequest

    # The stand-in refuses what it cannot sample in generate_async, as upstream refuses its ValueErrors there.
    sender = run(runner, bundle, contract(PROMPT, 4, runtime_top_p_decay=np.float32(0.5))).wait()
    assert isinstance(sender.error, InvalidRequest) and sender.error.field == "generate_async"
    assert "top_p_decay" in str(sender.error) and not sender.responses


def test_a_tensorrt_llm_repository_never_falls_back_to_the_stand_in():
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError:
        with pytest.raises(LlmApiUnavailable, match="tensorrt_llm"):
            load_llm_api("tensorrt_llm")
    else:
        pytest.skip("TensorRT-LLM is installed here: the load succeeds")
    with pytest.raises(ValueError, match="llm: 'auto'"):
        load_llm_api("auto")


def test_the_lora_request_names_the_repositorys_adapter_by_upstreams_fields(tmp_path):
    """A request that selected an adapter carries LoRARequest(lora_name, lora_int_id=its task id, lora_path=its PEFT
    folder) (executor/request.py@4ce835a's fields, bound to the recorded signature)."""
    from types import SimpleNamespace

    from llmapi_engine.model_config import LoraAdapterPath
    from llmapi_engine.request_mapping import LlmRequest

    CALLS.clear()
    request = LlmRequest([1, 2], {"max_tokens": 1}, lora=LoraAdapterPath("alpha", 1, str(tmp_path)))
    lora = LlmRunner._lora_request(SimpleNamespace(_api=API), request)
    assert (lora.lora_name, lora.lora_int_id, lora.lora_path, lora.lora_ckpt_source) == ("alpha", 1, str(tmp_path),
                                                                                          "hf")
    assert CALLS == [("LoRARequest", {"lora_name": "alpha", "lora_int_id": 1, "lora_path": str(tmp_path)})]
    assert LlmRunner._lora_request(SimpleNamespace(_api=API), LlmRequest([1], {"max_tokens": 1})) is None
