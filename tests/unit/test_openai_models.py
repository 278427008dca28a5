"""The API's model table: the base model and the repository's LoRA adapters by name, what a request's `model` sends the
BLS, /v1/models, and unknown ids refused as 404s naming them (before any request reaches tritonserver: the app here has
none behind it). Served adapters' output is tested in tests/integration/test_lora.py.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from openai_api.__main__ import main
from openai_api.app import Settings, create_app
from openai_api.errors import ApiError, from_triton
from openai_api.models import ServedModels, adapter_names, base_model_name

BASE = "Meta-Llama-3-8B-Instruct"
SERVED = ServedModels(BASE, ("sql", "support-v2"), created=1700000000)


def test_the_base_model_selects_no_adapter_and_an_adapter_sends_its_name():
    assert SERVED.bls_inputs(BASE) == {}
    lora_name = SERVED.bls_inputs("support-v2")["lora_name"]
    assert lora_name.shape == (1, 1) and lora_name.dtype == object and lora_name[0, 0] == b"support-v2"


@pytest.mark.parametrize("model", ["gpt-4o", "SQL", "sql ", "", f"{BASE}/sql"])
def test_an_unknown_model_is_a_404_naming_it_and_what_is_served(model):
    with pytest.raises(ApiError) as caught:
        SERVED.bls_inputs(model)
    error = caught.value
    assert (error.status, error.param, error.code) == (404, "model", "model_not_found")
    assert f"model {model!r} does not exist" in error.message
    assert f"'{BASE}', 'sql', 'support-v2'" in error.message


def test_cards_are_openai_model_objects_with_an_adapters_parent_the_base():
    assert SERVED.cards() == [
        {"id": BASE, "object": "model", "created": 1700000000, "owned_by": "llama3-triton", "parent": None},
        {"id": "sql", "object": "model", "created": 1700000000, "owned_by": "llama3-triton", "parent": BASE},
        {"id": "support-v2", "object": "model", "created": 1700000000, "owned_by": "llama3-triton", "parent": BASE},
    ]
    with pytest.raises(ApiError):
        SERVED.card("nope")


def test_an_adapter_named_as_the_base_model_is_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="'sql' is also a LoRA adapter's name"):
        ServedModels("sql", ("sql",))
    (tmp_path / "repository.json").write_text('{"lora_adapters": [{"name": "sql", "task_id": 1, "rank": 8}]}')
    with pytest.raises(SystemExit, match="'sql' is also a LoRA adapter's name"):
        main(["--triton-grpc", "127.0.0.1:1", "--repo", str(tmp_path), "--model-name", "sql"])


def test_names_from_repository_json():
    manifest = {"tokenizer_dir": "/models/Meta-Llama-3-8B-Instruct", "target": "/build/ckpt",
                "lora_adapters": [{"name": "sql", "task_id": 1, "rank": 8}, {"name": "chat", "task_id": 2, "rank": 16}]}
    assert base_model_name(manifest) == BASE and adapter_names(manifest) == ("sql", "chat")
    assert base_model_name({"tokenizer_dir": "build/assets/tokenizer", "target": "build/assets/tiny-target-awq"}) \
        == "tiny-target-awq"
    assert base_model_name({}) == "llama3" and adapter_names({}) == ()


def test_the_bls_refusing_a_name_is_an_error_of_model():
    error = from_triton("tensorrt_llm_bls: preprocessing: lora_name: unknown LoRA adapter 'x' (this repository "
                        "serves: a)")
    assert (error.status, error.param) == (400, "model")


@pytest.fixture(scope="module")
def client():
    app = create_app(Settings(triton_grpc="127.0.0.1:1", model_name=BASE, adapters=("sql", "support-v2")))
    with TestClient(app) as client:
        yield client


def test_routes_list_and_retrieve_the_adapters(client):
    listed = client.get("/v1/models").json()
    assert [(m["id"], m["parent"]) for m in listed["data"]] == [(BASE, None), ("sql", BASE), ("support-v2", BASE)]
    assert client.get("/v1/models/sql").json()["parent"] == BASE
    assert client.get("/v1/models/gamma").status_code == 404


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "stream": True}),
])
def test_generation_routes_refuse_an_unknown_model_by_name(client, path, body):
    response = client.post(path, json={**body, "model": "gamma"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["param"] == "model" and "'gamma' does not exist" in error["message"]
