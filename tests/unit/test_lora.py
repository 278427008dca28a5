"""LoRA in the embedded engine and in the build: greedy output with an adapter equals peft's generate() on the same
weights, without one the base's; mixed batches; the backend's format, checks and cache semantics; the converter."""

from __future__ import annotations

import copy
import json
import threading

import numpy as np
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from bls.errors import InvalidRequest
from embedded_engine.lora import LoraCache, LoraLayout, adapter_from_tensors, prefetch
from embedded_engine.lora_layers import install_lora
from embedded_engine.peft_lora import AdapterError, adapter_modules, complete_modules, convert_peft_adapter
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.scheduler import Engine, HFModelRunner
from engine_build.lora import adapter_table, convert_lora_dir, write_prefetch_dir

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VOCAB = 256
PROMPTS = ([5, 17, 42, 99, 3, 250], [7, 7, 1, 200])
NEW_TOKENS = 12


def base_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    return LlamaForCausalLM(base_config()).eval()


def make_adapter(base_model, path, seed, targets, r, alpha, use_rslora=False):
    """A PEFT adapter with random, non-zero A and B (float16-exact values, so the float16 format loses nothing) saved
    with save_pretrained. The scalings chosen are powers of two: B * scale is then exact too."""
    model = get_peft_model(copy.deepcopy(base_model),
                           LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=use_rslora,
                                      lora_dropout=0.0))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_((torch.randn(parameter.shape, generator=generator) * 0.3).half().float())
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    make_adapter(base, root / "all", 1, ALL_MODULES, r=4, alpha=8)  # scale 2
    make_adapter(base, root / "qv-rslora", 2, ["q_proj", "v_proj"], r=4, alpha=16, use_rslora=True)  # 16/2 = 8
    make_adapter(base, root / "mlp", 3, ["gate_proj", "down_proj"], r=2, alpha=2)  # scale 1; up_proj zero-filled
    return root


@pytest.fixture(scope="module")
def converted(adapters, base):
    return {adapter.name: adapter for adapter in convert_lora_dir(adapters, base.config, max_rank=8)}


def peft_greedy(base_model, adapter_dir, prompt):
    model = base_model if adapter_dir is None else PeftModel.from_pretrained(copy.deepcopy(base_model),
                                                                           str(adapter_dir)).eval()
    with torch.no_grad():
        output = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
    return output[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def references(base, adapters):
    """Greedy tokens per (adapter name or None, prompt index), from transformers + peft."""
    return {(name, index): peft_greedy(base, None if name is None else adapters / name, prompt)
            for name in (None, "all", "qv-rslora", "mlp") for index, prompt in enumerate(PROMPTS)}


def lora_engine(base_model, modules, max_rank=8, cache_bytes=1 << 30):
    model = copy.deepcopy(base_model)
    layout = LoraLayout.from_config(model.config, tuple(modules), max_rank)
    slot = install_lora(model, layout)
    return Engine(HFModelRunner(model), EngineLimits(VOCAB, 128), max_active=8,
                  adapters=LoraCache(layout, cache_bytes), lora_slot=slot)


@pytest.fixture(scope="module")
def engine(base, adapters):
    modules, _ = adapter_modules(adapters)
    engine = lora_engine(base, modules)
    yield engine
    engine.shutdown()


def request_inputs(prompt, task_id=None, adapter=None):
    inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
              "request_output_len": np.array([NEW_TOKENS], np.int32)}
    if task_id is not None:
        inputs["lora_task_id"] = np.array([task_id], np.uint64)
    if adapter is not None:
        inputs["lora_weights"], inputs["lora_config"] = adapter.weights, adapter.config
    return inputs


def submit(engine, inputs, request_id="r"):
    """Submit one request; returns (event, tokens) where `event` is set when it finished."""
    (request,) = parse_generation_requests(inputs, request_id, engine.limits, True, adapters=engine.adapters)
    tokens, done = [], threading.Event()

    def on_event(event):
        assert event.error is None, event.error
        tokens.extend(event.token_ids)
        if event.finished:
            done.set()

    engine.submit(request, on_event)
    return done, tokens


def generate(engine, inputs):
    done, tokens = submit(engine, inputs)
    assert done.wait(60)
    return tokens


def test_greedy_output_with_each_adapter_equals_peft_and_without_equals_the_base(engine, converted, references):
    for index, prompt in enumerate(PROMPTS):
        assert generate(engine, request_inputs(prompt)) == references[(None, index)]
        for name, adapter in converted.items():
            assert references[(name, index)] != references[(None, index)], "the adapter must change the output"
            # First request of a task: weights with the id; later ones: the id alone (the backend's protocol).
            assert generate(engine, request_inputs(prompt, adapter.task_id, adapter)) == references[(name, index)]
            assert generate(engine, request_inputs(prompt, adapter.task_id)) == references[(name, index)]


def test_a_batch_mixing_adapters_and_none_keeps_each_requests_adapter(engine, converted, references):
    for adapter in converted.values():  # cached by an earlier request
        generate(engine, request_inputs(PROMPTS[0], adapter.task_id, adapter))
    plan = [(name, index) for index in range(len(PROMPTS)) for name in (None, *converted)]
    running = [submit(engine, request_inputs(PROMPTS[index], None if name is None else converted[name].task_id),
                      request_id=f"mix{n}") for n, (name, index) in enumerate(plan)]
    for (name, index), (done, tokens) in zip(plan, running, strict=True):
        assert done.wait(60)
        assert tokens == references[(name, index)], (name, index)


def test_the_kv_cache_of_one_adapter_is_never_reused_by_another_or_the_base(engine, base, converted, references):
    adapter = converted["all"]
    # Continues the sequence that ran with the adapter, whose cache is parked: a request with the adapter may reuse it,
    # the base may not.
    longer = [*PROMPTS[0], *references[("all", 0)]]
    generate(engine, request_inputs(longer, adapter.task_id, adapter))
    assert generate(engine, request_inputs(longer)) == peft_greedy(base, None, longer)


def test_an_unknown_task_id_without_weights_is_refused_naming_it(engine):
    with pytest.raises(InvalidRequest, match="LoRA task 999 not found in cache. Please send LoRA weights"):
        parse_generation_requests(request_inputs(PROMPTS[0], 999), "r", engine.limits, True, adapters=engine.adapters)


@pytest.mark.parametrize("change, field, words", [
    (lambda w, c: (w, None), "lora_config", "is required with lora_weights"),
    (lambda w, c: (None, c), "lora_weights", "is required with lora_config"),
    (lambda w, c: (w[:, :-1], c), "lora_weights", "has 13 rows, lora_config 14"),
    (lambda w, c: (w, np.concatenate([c[:, :, :2], c[:, :, 2:] * 0 + 9], axis=2)), "lora_config",
     "rank must be in \\[1, max_lora_rank 8\\]"),
    (lambda w, c: (w, _with(c, 0, 1, 2)), "lora_config", "layer must be in \\[0, 2\\)"),
    (lambda w, c: (w, _with(c, 0, 0, 8)), "lora_config", "module 8.*cross_attn_qkv not enabled"),
    (lambda w, c: (w, _with(c, 0, 0, 42)), "lora_config", "42 is not a TensorRT-LLM LoRA module id"),
    (lambda w, c: (w[:, :, :10], c), "lora_weights", "needs .* values"),
    (lambda w, c: (w, np.concatenate([c, np.ones_like(c[:, :, :1])], axis=2)), "lora_config", "DoRA"),
])
def test_bad_lora_tensors_are_refused_by_name(engine, converted, change, field, words):
    adapter = converted["all"]
    weights, config = change(adapter.weights, adapter.config)
    inputs = request_inputs(PROMPTS[0], 77)
    for name, value in (("lora_weights", weights), ("lora_config", config)):
        if value is not None:
            inputs[name] = value
    with pytest.raises(InvalidRequest, match=words) as raised:
        parse_generation_requests(inputs, "r", engine.limits, True, adapters=engine.adapters)
    assert raised.value.field == field
    assert 77 not in engine.adapters  # nothing half-stored


def _with(config, row, column, value):
    config = config.copy()
    config[0, row, column] = value
    return config


def test_weights_without_a_task_id_are_refused(engine, converted):
    adapter = converted["all"]
    with pytest.raises(InvalidRequest, match="lora_task_id: is required with lora_weights"):
        parse_generation_requests(request_inputs(PROMPTS[0], None, adapter), "r", engine.limits, True,
                                  adapters=engine.adapters)


def test_an_engine_without_lora_refuses_lora_inputs_by_name(base):
    engine = Engine(HFModelRunner(copy.deepcopy(base)), EngineLimits(VOCAB, 128))
    try:
        with pytest.raises(InvalidRequest, match="lora_task_id: LoRA is not supported .* built without adapters"):
            parse_generation_requests(request_inputs(PROMPTS[0], 1), "r", engine.limits, True, adapters=None)
    finally:
        engine.shutdown()


def test_the_cache_evicts_the_least_recently_used_and_running_requests_keep_their_adapter(base, adapters, converted):
    layout = LoraLayout.from_config(base.config, adapter_modules(adapters)[0], 8)
    size = {name: adapter_from_tensors(a.task_id, a.weights, a.config, layout).nbytes for name, a in converted.items()}
    cache = LoraCache(layout, size["all"] + max(size["mlp"], size["qv-rslora"]))  # room for two, not three
    for name in ("all", "mlp"):
        cache.resolve(converted[name].task_id, converted[name].weights, converted[name].config)
    held = cache.get(converted["mlp"].task_id)  # a request resolved it
    cache.get(converted["all"].task_id)  # "mlp" is now the least recently used
    cache.resolve(converted["qv-rslora"].task_id, converted["qv-rslora"].weights, converted["qv-rslora"].config)
    assert converted["mlp"].task_id not in cache and converted["all"].task_id in cache
    assert held.weights  # the request that holds it keeps its weights
    with pytest.raises(InvalidRequest, match=f"LoRA task {converted['mlp'].task_id} not found in cache"):
        cache.get(converted["mlp"].task_id)
    with pytest.raises(InvalidRequest, match="needs .* bytes; the cache holds 16"):
        LoraCache(layout, 16).resolve(5, converted["all"].weights, converted["all"].config)


def test_prefetched_adapters_serve_by_task_id_alone(base, converted, references, tmp_path):
    write_prefetch_dir(list(converted.values()), tmp_path / "lora")
    (tmp_path / "lora" / "notes").mkdir()  # not a task id: skipped, as the backend skips it
    modules = complete_modules({m for a in converted.values() for m in a.modules})
    engine = lora_engine(base, modules)
    try:
        assert sorted(prefetch(engine.adapters, tmp_path / "lora")) == sorted(a.task_id for a in converted.values())
        for name, adapter in converted.items():
            assert generate(engine, request_inputs(PROMPTS[1], adapter.task_id)) == references[(name, 1)]
        # The repository's adapters are pinned: their own weights may come again, others may not replace them.
        all_, mlp = converted["all"], converted["mlp"]
        assert generate(engine, request_inputs(PROMPTS[1], all_.task_id, all_)) == references[("all", 1)]
        with pytest.raises(InvalidRequest, match=f"LoRA task {all_.task_id} is one of this repository's adapters"):
            engine.adapters.resolve(all_.task_id, mlp.weights, mlp.config)
        assert generate(engine, request_inputs(PROMPTS[1], all_.task_id)) == references[("all", 1)]
    finally:
        engine.shutdown()


# ---- the converter --------------------------------------------------------------------------------------------


def test_conversion_is_hf_lora_converts_layout_with_partner_rows_zero_filled(adapters, converted, base):
    from safetensors.torch import load_file

    adapter = converted["qv-rslora"]
    assert adapter.task_id == 3 and adapter.rank == 4 and adapter.modules == ("attn_q", "attn_v")
    assert adapter.weights.dtype == np.float16 and adapter.config.dtype == np.int32
    tensors = load_file(str(adapters / "qv-rslora" / "adapter_model.safetensors"))
    # Rows: layer-major, modules in TensorRT-LLM's order; attn_k zero-filled (the engine applies q, k, v together).
    assert adapter.config[0].tolist() == [[1, 0, 4], [2, 0, 4], [3, 0, 4], [1, 1, 4], [2, 1, 4], [3, 1, 4]]
    a = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"].numpy()
    b = tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"].numpy()
    expected = np.concatenate([a.reshape(-1), (b * 16 / 2).reshape(-1)])  # alpha / sqrt(r)
    np.testing.assert_array_equal(adapter.weights[0, 5, : expected.size].astype(np.float32), expected)
    assert not adapter.weights[0, 5, expected.size:].any()  # zero padding to the longest row
    assert not adapter.weights[0, 4].any()  # the zero-filled attn_k of layer 1
    assert converted["mlp"].config[0, :, 0].tolist() == [5, 6, 7, 5, 6, 7]  # mlp_gate (up_proj) zero-filled
    assert adapter_table(list(converted.values())) == "all=1,mlp=2,qv-rslora=3"


def test_adapter_modules_complete_the_pairs_the_engine_applies_together(adapters):
    modules, largest = adapter_modules(adapters)
    assert modules == ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate")
    assert largest == 4
    assert complete_modules(["attn_v", "mlp_gate"]) == ("attn_q", "attn_k", "attn_v", "mlp_h_to_4h", "mlp_gate")


def test_adapters_for_another_base_are_refused_by_name(adapters, base):
    other = LlamaConfig(**{**base_config().to_dict(), "hidden_size": 128, "num_attention_heads": 4, "head_dim": 32})
    with pytest.raises(AdapterError, match="adapter 'all' layer 0 o_proj: lora_A \\[4, 64\\] .*the base needs "
                                           "\\[4, 128\\].*another base"):
        convert_lora_dir(adapters, other)
    shallow = LlamaConfig(**{**base_config().to_dict(), "num_hidden_layers": 1})
    with pytest.raises(AdapterError, match="adapter 'all' layer 1 .*the base has 1 layers"):
        convert_lora_dir(adapters, shallow)


def test_rank_above_the_maximum_and_modules_not_built_are_refused_by_name(adapters, base):
    with pytest.raises(AdapterError, match="adapter 'all': rank 4 is above max_lora_rank 2"):
        convert_lora_dir(adapters, base.config, max_rank=2)
    layout = LoraLayout.from_config(base.config, ("attn_q", "attn_k", "attn_v"), 8)
    with pytest.raises(AdapterError, match="adapter 'mlp': targets mlp_h_to_4h, mlp_4h_to_h, mlp_gate, which the "
                                           "engine is not built for"):
        convert_peft_adapter(adapters / "mlp", 1, layout)


@pytest.mark.parametrize("key, value, words", [
    ("modules_to_save", ["lm_head"], "cannot be switched per request"),
    ("use_dora", True, "DoRA is not supported"),
    ("rank_pattern", {"q_proj": 8}, "per-module ranks"),
    ("bias", "all", "LoRA biases"),
])
def test_adapter_settings_that_cannot_be_served_are_refused(adapters, base, tmp_path, key, value, words):
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(adapters / "mlp", folder)
    settings = json.loads((folder / "adapter_config.json").read_text())
    settings[key] = value
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    with pytest.raises(AdapterError, match=f"adapter 'bad': {key} .*{words}"):
        convert_peft_adapter(folder, 1, LoraLayout.from_config(base.config, complete_modules(["mlp_h_to_4h",
                                                                                              "mlp_4h_to_h"]), 8))


def test_an_adapter_name_must_be_plain(adapters, base, tmp_path):
    import shutil

    shutil.copytree(adapters / "mlp", tmp_path / "a b")
    with pytest.raises(AdapterError, match="adapter 'a b': a name is"):
        convert_peft_adapter(tmp_path / "a b", 1, LoraLayout.from_config(base.config, ("mlp_h_to_4h",), 8))


def test_the_same_weights_sent_again_are_the_same_adapter_and_new_ones_replace_it(base, adapters, converted):
    cache = LoraCache(LoraLayout.from_config(base.config, adapter_modules(adapters)[0], 8))
    adapter = converted["all"]
    first = cache.resolve(7, adapter.weights, adapter.config)
    assert cache.resolve(7, adapter.weights.copy(), adapter.config.copy()) is first  # not parsed again: same serial
    other = converted["mlp"]
    replaced = cache.resolve(7, other.weights, other.config)
    assert replaced is not first and cache.get(7) is replaced


def test_the_repositorys_adapters_are_never_evicted(base, adapters, converted):
    layout = LoraLayout.from_config(base.config, adapter_modules(adapters)[0], 8)
    parsed = {name: adapter_from_tensors(a.task_id, a.weights, a.config, layout) for name, a in converted.items()}
    cache = LoraCache(layout, parsed["all"].nbytes + parsed["qv-rslora"].nbytes)
    cache.put(parsed["all"], pinned=True)
    for task_id in (10, 11):  # each evicts the one before it, never the pinned adapter
        cache.resolve(task_id, converted["qv-rslora"].weights, converted["qv-rslora"].config)
    assert cache.task_ids() == [parsed["all"].task_id, 11]
    full = LoraCache(layout, parsed["all"].nbytes)  # room for the pinned adapter only
    full.put(parsed["all"], pinned=True)
    with pytest.raises(InvalidRequest, match="of them for the repository's own adapters"):
        full.resolve(12, converted["mlp"].weights, converted["mlp"].config)
