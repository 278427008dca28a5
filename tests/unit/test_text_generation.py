"""bls.generation.generator with the real tokenizer and an in-process stand-in for the child models.

The stand-in preprocesses with the real Preprocessor, "generates" a fixed token script (streamed one token
per response, like the engine) and postprocesses with the real Postprocessor; the real models are covered
by the integration tests.
"""

from __future__ import annotations

import threading
from itertools import pairwise

import numpy as np
import pytest

from bls.errors import InvalidRequest
from bls.generation.generator import BlsConfig, TextGenerator, TextRequest
from bls.response_loop import merge_streamed
from bls.text.postprocessing import Postprocessor
from bls.text.preprocessing import Preprocessor

# Byte-level pieces that split "é", "🙂" and "世" across tokens, plus ordinary words.
SCRIPT_TEXT = "Hi é 🙂 世界 done"
CONFIG = BlsConfig(engine_model="engine", preprocessing_model="pre", postprocessing_model="post",
                   draft_model=None, max_draft_len=0, accumulate_tokens=False, skip_special_tokens=True,
                   exclude_input_in_output=True)


class ScriptedModels:
    def __init__(self, bundle, script: list[int]):
        self.pre = Preprocessor(bundle)
        self.post = Postprocessor(bundle, skip_special_tokens=True)
        self.script = script
        self.left = []  # request ids of streams left before their end (the real ModelCaller cancels the engine call)

    def infer(self, model_name, inputs, outputs, request_id=""):
        return self.pre(dict(inputs)) if model_name == "pre" else self.post(dict(inputs))

    def stream_each(self, model_name, inputs, outputs, request_id, on_response):
        """As bls.relay.engine_streams.RelayedEngineStreams: each response to on_response on the caller's thread."""
        for response in self.stream(model_name, inputs, outputs, request_id):
            if not on_response(response):
                self.left.append(request_id)
                return False
        return True

    def stream(self, model_name, inputs, outputs, request_id=""):
        n = int(inputs["request_output_len"].reshape(-1)[0])
        for token in self.script[:n]:
            yield {"output_ids": np.array([[[token]]], np.int32), "sequence_length": np.array([[1]], np.int32)}


class Sink:
    def __init__(self, cancel_after: int | None = None):
        self.responses = []
        self.final = False
        self.cancel_after = cancel_after

    def send(self, outputs, final=False):
        assert not self.final, "nothing may follow the final response"
        self.responses.append(outputs)
        self.final = final

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.responses) >= self.cancel_after


def text_of(outputs, row=0) -> str:
    return outputs["text_output"].reshape(-1)[row].decode()


def request(config=CONFIG, **inputs) -> TextRequest:
    tensors = {"text_input": np.array([[b"Hello"]], dtype=object), "max_tokens": np.array([[50]], np.int32)}
    tensors.update({k: np.asarray(v) for k, v in inputs.items()})
    return TextRequest.from_inputs(tensors, config, "req")


@pytest.fixture()
def models(bundle):
    return ScriptedModels(bundle, bundle.tokenizer.encode(SCRIPT_TEXT, add_special_tokens=False))


def test_streamed_deltas_add_up_to_the_final_text(bundle, models):
    sink = Sink()
    TextGenerator(CONFIG, models, bundle).generate(request(stream=[[True]]), sink)
    assert sink.final
    assert "".join(text_of(r) for r in sink.responses) == SCRIPT_TEXT
    assert all("\ufffd" not in text_of(r) for r in sink.responses)  # no half characters on the wire
    last = sink.responses[-1]
    assert last["finish_reason"][0, 0] == b"stop" and last["num_output_tokens"][0, 0] == len(models.script)

    plain = Sink()
    TextGenerator(CONFIG, models, bundle).generate(request(), plain)
    assert len(plain.responses) == 1 and text_of(plain.responses[0]) == SCRIPT_TEXT


def test_streamed_responses_carry_running_token_counts_only_when_asked(bundle, models):
    plain, counted = Sink(), Sink()
    TextGenerator(CONFIG, models, bundle).generate(request(stream=[[True]]), plain)
    TextGenerator(CONFIG, models, bundle).generate(request(stream=[[True]], return_num_output_tokens=[[True]]), counted)
    assert all(set(r) == {"text_output"} for r in plain.responses[:-1])
    counts = [int(r["num_output_tokens"][0, 0]) for r in counted.responses[:-1]]
    assert counts == list(range(1, len(models.script) + 1))  # one token per engine response here
    for sink in (plain, counted):  # the final response always has both counts
        assert sink.responses[-1]["num_output_tokens"][0, 0] == len(models.script)
        assert sink.responses[-1]["num_input_tokens"][0, 0] > 0


def test_accumulate_tokens_sends_the_whole_text_so_far(bundle, models):
    config = BlsConfig(**{**CONFIG.__dict__, "accumulate_tokens": True})
    sink = Sink()
    TextGenerator(config, models, bundle).generate(request(config, stream=[[True]]), sink)
    texts = [text_of(r) for r in sink.responses]
    assert texts[-1] == SCRIPT_TEXT
    assert all(later.startswith(earlier) for earlier, later in pairwise(texts))


@pytest.mark.parametrize("accumulate", [False, True])
def test_stream_interval_sends_every_nth_token_after_the_first(bundle, models, accumulate):
    config = BlsConfig(**{**CONFIG.__dict__, "stream_interval": 3, "accumulate_tokens": accumulate})
    sink = Sink()
    TextGenerator(config, models, bundle).generate(
        request(config, stream=[[True]], return_num_output_tokens=[[True]]), sink)
    assert len(models.script) == 5
    # The first token at once, then 3 more; the 5th (what is left) goes before the final response.
    assert [int(r["num_output_tokens"][0, 0]) for r in sink.responses[:-1]] == [1, 4, 5]
    texts = [text_of(r) for r in sink.responses]
    if accumulate:
        assert texts[-1] == SCRIPT_TEXT and all(b.startswith(a) for a, b in pairwise(texts))
    else:
        assert "".join(texts) == SCRIPT_TEXT


def test_stream_interval_holds_only_streamed_responses(bundle, models):
    config = BlsConfig(**{**CONFIG.__dict__, "stream_interval": 1000})
    sink = Sink()
    TextGenerator(config, models, bundle).generate(request(config, stream=[[True]]), sink)
    assert len(sink.responses) == 3  # the first token, everything else, the final response
    assert "".join(text_of(r) for r in sink.responses) == SCRIPT_TEXT


@pytest.mark.parametrize("engine_default", [True, False])
def test_a_request_that_does_not_say_gets_the_engines_prompt_echo(engine_default):
    """As upstream's ensemble and BLS: exclude_input_in_output absent, the engine's parameter decides."""
    config = BlsConfig(**{**CONFIG.__dict__, "exclude_input_in_output": engine_default})
    assert request(config).exclude_input_in_output is engine_default
    assert request(config, exclude_input_in_output=[[not engine_default]]).exclude_input_in_output is not engine_default


def test_a_stream_never_echoes_the_prompt(bundle, models):
    """As TensorRT-LLM streams (and NVIDIA's BLS and clients expect): exclude_input_in_output=false echoes the
    prompt in a non-streamed answer only."""
    sink = Sink()
    TextGenerator(CONFIG, models, bundle).generate(request(stream=[[True]], exclude_input_in_output=[[False]]), sink)
    assert "".join(text_of(r) for r in sink.responses) == SCRIPT_TEXT


def test_length_finish_reason(bundle, models):
    sink = Sink()
    TextGenerator(CONFIG, models, bundle).generate(request(max_tokens=[[3]]), sink)
    assert sink.responses[0]["finish_reason"][0, 0] == b"length"


def test_cancelled_client_stops_the_engine(bundle, models):
    sink = Sink(cancel_after=2)
    TextGenerator(CONFIG, models, bundle).generate(request(stream=[[True]]), sink)
    assert models.left, "the engine stream is left (which cancels the engine request)"
    assert sink.responses[-1]["finish_reason"][0, 0] == b"cancelled"


def test_batch_rows_carry_their_index(bundle, models):
    sink = Sink()
    inputs = {"text_input": np.array([[b"a"], [b"b"]], dtype=object), "max_tokens": np.array([[50], [50]], np.int32),
              "stream": np.array([[True], [True]])}
    TextGenerator(CONFIG, models, bundle).generate(TextRequest.from_inputs(inputs, CONFIG, "r"), sink)
    per_row = {0: "", 1: ""}
    for response in sink.responses[:-1]:
        per_row[int(response["batch_index"][0, 0])] += text_of(response)
    for row in (0, 1):
        per_row[row] += text_of(sink.responses[-1], row)
    assert per_row == {0: SCRIPT_TEXT, 1: SCRIPT_TEXT}


def merged_stream(responses, accumulate=False):
    """What a client receives when every streamed response waited behind others' sends: all merged."""
    merged = [responses[0]]
    for response in responses[1:-1]:
        merged[-1] = merge_streamed(merged[-1], response, accumulate)
    return merged + [responses[-1]]


@pytest.mark.parametrize("accumulate", [False, True])
def test_merged_responses_carry_the_same_text_and_count(bundle, models, accumulate):
    config = BlsConfig(**{**CONFIG.__dict__, "accumulate_tokens": accumulate})
    sink = Sink()
    TextGenerator(config, models, bundle).generate(request(config, stream=[[True]], return_num_output_tokens=[[True]]),
                                                   sink)
    assert len(sink.responses) > 3
    (merged, final) = merged_stream(sink.responses, accumulate)
    text = text_of(merged) if accumulate else text_of(merged) + text_of(final)
    assert text == SCRIPT_TEXT
    assert merged["num_output_tokens"][0, 0] == sink.responses[-2]["num_output_tokens"][0, 0]


@pytest.mark.parametrize("inputs, field", [
    ({"max_tokens": [[0]]}, "max_tokens"),
    ({"num_draft_tokens": [[2]]}, "num_draft_tokens"),  # no draft model configured
    ({"num_draft_tokens": [[-1]]}, "num_draft_tokens"),
    ({"stream": [[True]], "beam_width": [[2]]}, "beam_width"),
    ({"use_draft_logits": [[True]]}, "use_draft_logits"),
])
def test_request_validation(inputs, field):
    with pytest.raises(InvalidRequest) as error:
        request(**inputs)
    assert error.value.field == field


def test_draft_length_is_bounded_by_the_engine():
    config = BlsConfig(**{**CONFIG.__dict__, "draft_model": "draft", "max_draft_len": 4})
    assert request(config, num_draft_tokens=[[4]]).num_draft_tokens == 4
    with pytest.raises(InvalidRequest, match="max_draft_len 4"):
        request(config, num_draft_tokens=[[5]])


def test_a_gone_client_interrupts_the_wait_for_the_engine(bundle):
    """TextGenerator.cancel (called when the response loop learns the client has gone): the stream waiting for
    its engine's next response stops now and the request ends as cancelled."""
    from bls.errors import GenerationCancelled

    waiting = threading.Event()

    class SlowEngine(ScriptedModels):
        cancelled: set[str] = set()

        def cancel(self, request_id):
            self.cancelled.add(request_id)

        def stream(self, model_name, inputs, outputs, request_id=""):
            yield {"output_ids": np.array([[[self.script[0]]]], np.int32), "sequence_length": np.array([[1]], np.int32)}
            waiting.set()
            for _ in range(500):  # the engine's next response would come late
                if any(request_id.startswith(f"{prefix}-") for prefix in self.cancelled):
                    raise GenerationCancelled(request_id)
                threading.Event().wait(0.01)
            raise AssertionError("never cancelled")

    models = SlowEngine(bundle, bundle.tokenizer.encode(SCRIPT_TEXT, add_special_tokens=False))
    generator = TextGenerator(CONFIG, models, bundle)
    text_request, sink = request(stream=[[True]]), Sink()
    worker = threading.Thread(target=generator.generate, args=(text_request, sink))
    worker.start()
    assert waiting.wait(5)
    models.cancel(text_request.request_id)  # what the relay transport does when the client goes
    worker.join(5)
    assert not worker.is_alive()
    assert sink.responses[-1]["finish_reason"][0, 0] == b"cancelled"
