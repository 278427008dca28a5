"""A repository built as `make repo DECOUPLED=false QUERY_SPECIAL_TOKENS=parse` builds it: the models that
clients using unary RPCs need (NVIDIA's inflight_batcher_llm_client.py without --streaming,
e2e_grpc_speculative_decoding_client.py, which also needs EXCLUDE_INPUT_IN_OUTPUT=false: it reads the prompt
back), in the mode the README's OpenAI-frontend command uses.

Starts its own server on the real tiny target and draft (not possible with --server-url).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from testkit.grpc import tensor
from tests.integration.conftest import ASSETS, built_repository_server
from tests.integration.test_conformance import openai_frontend_inputs
from tests.integration.test_text import strings

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! How are you?"}]


@pytest.fixture(scope="module")
def unary(request, tmp_path_factory):
    with built_repository_server(request, tmp_path_factory, "unary", draft=ASSETS / "tiny-draft-awq",
                                 decoupled=False, query_special_tokens="parse") as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        yield client
        client.close()


def infer(client, model, inputs: dict, outputs: list[str]) -> dict:
    result = client.infer(model, [tensor(k, v) for k, v in inputs.items()],
                          outputs=[grpcclient.InferRequestedOutput(o) for o in outputs])
    return {o: result.as_numpy(o) for o in outputs}


def text(client, model, **inputs) -> str:
    base = {"max_tokens": np.array([[12]], np.int32), **inputs}
    output = infer(client, model, base, ["text_output"])["text_output"]
    assert output.shape == (1,)
    return output[0].decode()


def test_the_engine_answers_model_infer(unary):
    out = infer(unary, "tensorrt_llm", {"input_ids": np.array([[128000, 9906]], np.int32),
                                        "input_lengths": np.array([[2]], np.int32),
                                        "request_output_len": np.array([[5]], np.int32)},
                ["output_ids", "sequence_length"])
    assert out["output_ids"].shape[-1] == int(out["sequence_length"].reshape(-1)[0]) >= 2


def test_ensemble_and_bls_answer_model_infer(unary):
    assert text(unary, "ensemble", text_input=strings("Hello")) == text(unary, "tensorrt_llm_bls",
                                                                         text_input=strings("Hello"))


def test_streaming_is_refused_with_the_setting_to_change(unary):
    with pytest.raises(InferenceServerException) as error:
        text(unary, "tensorrt_llm_bls", text_input=strings("Hello"), stream=np.array([[True]]))
    assert "stream" in str(error.value) and "DECOUPLED" in str(error.value)


def test_speculative_decoding_over_unary_engines_equals_plain_greedy(unary):
    plain = text(unary, "tensorrt_llm_bls", text_input=strings("Once upon a time"))
    assert text(unary, "tensorrt_llm_bls", text_input=strings("Once upon a time"),
                num_draft_tokens=np.array([[3]], np.int32)) == plain


def test_a_prompt_rendered_by_the_openai_frontend_is_the_conversation(unary, bundle):
    """parse mode: the frontend's rendered chat reaches the engine as the chat (control tokens, one BOS),
    so it generates exactly what the same conversation sent as `messages` does."""
    import json

    rendered = bundle.tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    inputs = openai_frontend_inputs(rendered, stream=False)
    inputs.update(temperature=np.array([[0.0]], np.float32), max_tokens=np.array([[12]], np.int32))
    via_frontend = infer(unary, "ensemble", inputs, ["text_output"])["text_output"][0].decode()
    via_messages = text(unary, "ensemble", messages=strings(json.dumps(CONVERSATION)),
                        temperature=np.array([[0.0]], np.float32), stop_words=inputs["stop_words"])
    assert via_frontend == via_messages
