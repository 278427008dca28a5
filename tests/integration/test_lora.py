"""Multi-LoRA end to end, against a server of its own: a repository built with `LORA_DIR` (two PEFT adapters made here
on the tiny target's served weights) and a draft. The engine's greedy output with an adapter equals peft's generate()
on the same weights; adapters are chosen by name (lora_name) on the ensemble and the BLS, or with NVIDIA's raw
lora_task_id / lora_weights / lora_config; unknown names and ids are refused naming them; concurrent streams with
different adapters each keep their own; speculative and guided decoding work with an adapter. The OpenAI-compatible API
in front of it (--repo) serves each adapter as a model, by name.

The flow follows --repo's: against an LLM API repository (`llm` parameter) the server is `make repo ENGINE=llmapi
LORA_DIR=...`'s (the stand-in, adapters by path through LoRARequest, no draft: LoRA x speculation is refused there),
whose checkpoint is the tiny target's ModelOpt export; uploaded weights are refused by name there.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import openai
import pytest

from embedded_engine.lora import LoraLayout
from embedded_engine.peft_lora import convert_peft_adapter
from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream, streamed_texts
from testkit.openai_api import openai_api
from tests.integration.conftest import (
    ASSETS,
    built_llmapi_repository_server,
    built_repository_server,
    served_engine_parameters,
)

ENGINE, ENSEMBLE, BLS = "tensorrt_llm", "ensemble", "tensorrt_llm_bls"
PEFT_NAMES = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_dense": "o_proj",
              "mlp_h_to_4h": "gate_proj", "mlp_gate": "up_proj", "mlp_4h_to_h": "down_proj"}
# name: (seed, PEFT target modules, r, lora_alpha, use_rslora); scalings 2 and 8/sqrt(4) = 4: powers of two, so
# B * scale in float16 is exact and the engine's weights are exactly peft's.
ADAPTERS = {
    "alpha": (1, list(PEFT_NAMES.values()), 8, 16, False),
    "beta": (2, ["q_proj", "v_proj", "down_proj"], 4, 8, True),
}
PROMPT = "Tell me a story about a brave little toaster."
TEXT = {"text_input": PROMPT, "max_tokens": 16, "end_id": -1}


LLMAPI = "llmapi"
# The checkpoint each flow's repository serves: the embedded flow's AWQ checkpoint, the LLM API flow's ModelOpt export.
SERVED_CHECKPOINT = {"embedded": "tiny-target-awq", LLMAPI: "tiny-target-modelopt-hf"}


@pytest.fixture(scope="module")
def flow(request) -> str:
    """The flow under test: --repo's (an LLM API repository has an `llm` parameter)."""
    return LLMAPI if served_engine_parameters(request.config).get("llm") is not None else "embedded"


@pytest.fixture(scope="module")
def base_model(flow):
    """The weights the engine serves (the flow's checkpoint of the tiny target, dequantised as the engine loads it)."""
    from embedded_engine.checkpoint import load_checkpoint

    return load_checkpoint(ASSETS / SERVED_CHECKPOINT[flow]).model


@pytest.fixture(scope="module")
def lora_dir(base_model, tmp_path_factory):
    import torch
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("adapters")
    for name, (seed, targets, rank, alpha, rslora) in ADAPTERS.items():
        model = get_peft_model(copy.deepcopy(base_model), LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                                                     use_rslora=rslora, lora_dropout=0.0))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # non-zero A and B, float16-exact
            for parameter_name, parameter in model.named_parameters():
                if "lora_" in parameter_name:
                    parameter.copy_((torch.randn(parameter.shape, generator=generator) * 0.2).half().float())
        model.save_pretrained(str(root / name))
    return root


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, lora_dir, flow):
    if flow == LLMAPI:
        with built_llmapi_repository_server(request, tmp_path_factory, "lora", "--lora-dir", str(lora_dir)) as server:
            yield server
        return
    with built_repository_server(request, tmp_path_factory, "lora", lora_dir=lora_dir,
                                 draft=ASSETS / "tiny-draft-awq") as server:
        yield server


@pytest.fixture(scope="module")
def task_ids(server):
    manifest = json.loads((server.repo / "repository.json").read_text())
    return {adapter["name"]: adapter["task_id"] for adapter in manifest["lora_adapters"]}


@pytest.fixture(scope="module")
def prompt_ids(server):
    from bls.text.tokenizer import TokenizerBundle
    from engine_build.repository import repository_tokenizer

    return TokenizerBundle.from_dir(repository_tokenizer(server.repo)).encode_text(PROMPT, add_special_tokens=True)


def peft_greedy(base_model, lora_dir, name, prompt, max_tokens=16) -> list[int]:
    import torch
    from peft import PeftModel

    model = base_model if name is None else PeftModel.from_pretrained(copy.deepcopy(base_model),
                                                                      str(lora_dir / name)).eval()
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(prompt)))
    return out[0, len(prompt):].tolist()


def engine_body(prompt, **extra) -> dict:
    return {"input_ids": prompt, "input_lengths": [len(prompt)], "request_output_len": [16],
            "exclude_input_in_output": True, **extra}


def test_the_engine_with_each_prefetched_adapter_equals_peft_and_without_equals_the_base(
        server, base_model, lora_dir, task_ids, prompt_ids):
    base = generate(server.http_url, ENGINE, engine_body(prompt_ids))["output_ids"]
    assert base == peft_greedy(base_model, lora_dir, None, prompt_ids)
    for name, task_id in task_ids.items():
        expected = peft_greedy(base_model, lora_dir, name, prompt_ids)
        assert expected != base, f"adapter {name} must change the output"
        assert generate(server.http_url, ENGINE, engine_body(prompt_ids, lora_task_id=[task_id]))["output_ids"] \
            == expected


def test_raw_weights_sent_with_a_request_then_the_task_id_alone(server, base_model, lora_dir, prompt_ids, flow):
    """NVIDIA's protocol, unchanged: weights and config with the first request of a task id, then the id alone; here
    over gRPC to the ensemble (float16 lora_weights, as Triton's contract declares them)."""
    if flow == LLMAPI:
        pytest.skip("the LLM API takes adapters by path: uploaded weights are refused there (the next test)")
    layout = LoraLayout.from_config(base_model.config, tuple(PEFT_NAMES), 64)
    adapter = convert_peft_adapter(lora_dir / "beta", 100, layout)
    tensors = {"text_input": np.array([[PROMPT]], object), "max_tokens": np.array([[16]], np.int32),
               "end_id": np.array([[-1]], np.int32), "lora_task_id": np.array([[100]], np.uint64)}
    first = grpc_stream(server.grpc_url, ENSEMBLE, {**tensors, "lora_weights": adapter.weights,
                                                    "lora_config": adapter.config}, ["text_output"])
    assert first.error is None and first.completed
    again = grpc_stream(server.grpc_url, ENSEMBLE, tensors, ["text_output"])
    assert again.error is None
    by_name = generate(server.http_url, ENSEMBLE, {**TEXT, "lora_name": "beta"})["text_output"]
    for result in (first, again):
        assert b"".join(r["text_output"].reshape(-1)[0] for r in result.responses).decode() == by_name
    expected = peft_greedy(base_model, lora_dir, "beta", prompt_ids)
    assert generate(server.http_url, ENGINE, engine_body(prompt_ids, lora_task_id=[100]))["output_ids"] == expected


def test_the_llm_api_refuses_uploaded_weights_by_name(server, base_model, lora_dir, flow):
    """The LLM API takes an adapter as LoRARequest(lora_path), never as the C++ backend's lora_weights / lora_config:
    a request that uploads them is refused naming them (over gRPC to the ensemble, as NVIDIA's client sends them)."""
    if flow != LLMAPI:
        pytest.skip("the embedded flow takes uploaded weights (the test above)")
    layout = LoraLayout.from_config(base_model.config, tuple(PEFT_NAMES), 64)
    adapter = convert_peft_adapter(lora_dir / "beta", 100, layout)
    tensors = {"text_input": np.array([[PROMPT]], object), "max_tokens": np.array([[16]], np.int32),
               "lora_task_id": np.array([[100]], np.uint64), "lora_weights": adapter.weights,
               "lora_config": adapter.config}
    result = grpc_stream(server.grpc_url, ENSEMBLE, tensors, ["text_output"])
    assert result.error is not None and "takes LoRA adapters by path" in result.error, result.error
    assert "lora_weights" in result.error or "lora_config" in result.error


@pytest.mark.parametrize("model", [ENSEMBLE, BLS])
def test_lora_name_selects_the_adapter_as_its_task_id_does(server, task_ids, model):
    base = generate(server.http_url, model, TEXT)["text_output"]
    for name, task_id in task_ids.items():
        by_name = generate(server.http_url, model, {**TEXT, "lora_name": name})["text_output"]
        assert by_name == generate(server.http_url, model, {**TEXT, "lora_task_id": task_id})["text_output"]
        assert by_name != base
        streamed = generate_stream(server.http_url, model, {**TEXT, "lora_name": name, "stream": True})
        assert "".join(event["text_output"] for event in streamed) == by_name


@pytest.mark.parametrize("model", [ENSEMBLE, BLS])
def test_unknown_names_and_task_ids_are_refused_naming_them(server, model, flow):
    with pytest.raises(HttpError) as error:
        generate(server.http_url, model, {**TEXT, "lora_name": "gamma"})
    assert error.value.status == 400
    assert "unknown LoRA adapter 'gamma'" in error.value.message and "alpha, beta" in error.value.message
    with pytest.raises(HttpError) as error:
        generate(server.http_url, model, {**TEXT, "lora_task_id": 999})
    assert error.value.status == 400
    # The C++ backend's words (a task id it may yet be sent weights for); the LLM API's: the repository's adapters.
    assert ("LoRA task 999 not found: this repository's adapters are alpha=1, beta=2" if flow == LLMAPI
            else "LoRA task 999 not found in cache") in error.value.message
    with pytest.raises(HttpError) as error:
        generate(server.http_url, model, {**TEXT, "lora_name": "alpha", "lora_task_id": 2})
    assert error.value.status == 400 and "lora_task_id" in error.value.message


def test_concurrent_streams_with_different_adapters_each_keep_their_own(server):
    names = [None, "alpha", "beta"] * 3
    bodies = [{**TEXT, "max_tokens": 12 + i, **({"lora_name": name} if name else {})} for i, name in enumerate(names)]
    for body, text in zip(bodies, streamed_texts(server.http_url, BLS, bodies, timeout=180), strict=True):
        assert text == generate(server.http_url, BLS, body)["text_output"], body


def test_speculative_decoding_with_an_adapter_equals_the_adapters_own_greedy_output(server, flow):
    """The target applies the adapter while verifying; the draft proposes without it (it has none): greedy output is
    the target's with the adapter, token for token."""
    if flow == LLMAPI:
        pytest.skip("an LLM API LORA_DIR build has no speculation: LoRA x speculative decoding is untested upstream "
                    "(engine_build/llmapi_flow.py check_combinations refuses it)")
    plain = generate(server.http_url, BLS, {**TEXT, "lora_name": "alpha"})["text_output"]
    assert generate(server.http_url, BLS, {**TEXT, "lora_name": "alpha", "num_draft_tokens": 4})["text_output"] \
        == plain


def test_guided_decoding_with_an_adapter(server):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    body = {**TEXT, "max_tokens": 48, "lora_name": "beta", "guided_decoding_guide_type": "json_schema",
            "guided_decoding_guide": json.dumps(schema)}
    result = generate(server.http_url, BLS, body)
    if result["finish_reason"] == "stop":
        assert isinstance(json.loads(result["text_output"])["name"], str)
    else:  # cut short by max_tokens: a prefix of a valid document
        assert result["finish_reason"] == "length" and result["text_output"].startswith("{")
    assert result["text_output"] != generate(server.http_url, BLS, {**body, "lora_name": "alpha"})["text_output"]


# ---- the OpenAI-compatible API: adapters as models ------------------------------------------------------------------
ASK = [{"role": "user", "content": PROMPT}]


@pytest.fixture(scope="module")
def api_client(server, tmp_path_factory):
    """`python -m openai_api --repo <this repository>` in front of this server, and the official client of it."""
    log = tmp_path_factory.mktemp("openai_api") / "openai_api.log"
    with openai_api(server.grpc_url, log, "--repo", str(server.repo)) as api:
        yield openai.OpenAI(base_url=api.v1, api_key="unused", max_retries=0, timeout=120)
        assert "Traceback" not in log.read_text(), log.read_text()


def test_the_openai_api_serves_each_adapter_as_a_model(api_client, server, task_ids):
    models = api_client.models.list().data
    base = models[0].id
    assert [(m.id, m.parent) for m in models] == [(base, None)] + [(name, base) for name in task_ids]
    assert api_client.models.retrieve("beta").parent == base
    # ignore_eos (end_id -1): 16 tokens each, so the texts compared are never cut short by the random model's end of
    # turn
    chat_texts = {}
    for name in (None, *task_ids):
        selects = {"lora_name": name} if name else {}
        expected = generate(server.http_url, BLS, {"messages": json.dumps(ASK), "max_tokens": 16, "end_id": -1,
                                                   "temperature": 0.0, **selects})["text_output"]
        reply = api_client.chat.completions.create(model=name or base, messages=ASK, max_tokens=16, temperature=0,
                                                   extra_body={"ignore_eos": True})
        assert (reply.model, reply.choices[0].message.content) == (name or base, expected), name
        chat_texts[name] = expected
    assert chat_texts["alpha"] != chat_texts[None] and chat_texts["beta"] != chat_texts[None]
    streamed = api_client.chat.completions.create(model="beta", messages=ASK, max_tokens=16, temperature=0,
                                                  stream=True, extra_body={"ignore_eos": True})
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == chat_texts["beta"]
    completion = api_client.completions.create(model="alpha", prompt=PROMPT, max_tokens=16, temperature=0,
                                               extra_body={"ignore_eos": True})
    assert completion.choices[0].text == generate(server.http_url, BLS, {**TEXT, "lora_name": "alpha"})["text_output"]


def test_the_openai_api_refuses_an_unknown_model_naming_it(api_client):
    for create in (lambda: api_client.chat.completions.create(model="gamma", messages=ASK, max_tokens=4),
                   lambda: api_client.completions.create(model="gamma", prompt=PROMPT, max_tokens=4, stream=True),
                   lambda: api_client.models.retrieve("gamma")):
        with pytest.raises(openai.NotFoundError) as caught:
            create()
        assert "'gamma' does not exist" in caught.value.message and "'alpha', 'beta'" in caught.value.message
