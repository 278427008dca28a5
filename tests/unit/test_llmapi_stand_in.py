"""The stand-in LLM API (llmapi_engine/stand_in): its signatures and fields equal TensorRT-LLM 1.2.x's recorded ones
(tests/unit/upstream_llmapi.py), and it behaves as the LLM API does: cumulative outputs with their diffs, abort,
stop words, unknown LLM() keys refused, iteration stats, n-gram drafting."""

import asyncio
import dataclasses
import inspect
from pathlib import Path

import pytest

from engine_build import upstream_llm_args
from llmapi_engine import stand_in
from llmapi_engine.stand_in import llm_args
from llmapi_engine.stand_in.llm import LLM
from llmapi_engine.stand_in.outputs import CompletionOutput, Logprob, RequestOutput
from tests.unit import upstream_llmapi as upstream

ASSETS = Path(__file__).resolve().parents[2] / "build" / "assets"
MODEL = ASSETS / "tiny-target-hf"


def parameters(function, skip_self=True):
    result = []
    for parameter in list(inspect.signature(function).parameters.values())[1 if skip_self else 0:]:
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            result.append((f"**{parameter.name}", None))
        else:
            default = upstream.REQUIRED if parameter.default is inspect.Parameter.empty else parameter.default
            result.append((parameter.name, default))
    return tuple(result)


def dataclass_fields(cls):
    return tuple((f.name, upstream.REQUIRED if f.default is dataclasses.MISSING and
                  f.default_factory is dataclasses.MISSING else f.default)
                 for f in dataclasses.fields(cls) if f.init)


def test_the_signatures_are_upstreams():
    assert parameters(LLM.__init__) == upstream.LLM_INIT
    assert parameters(LLM.generate_async) == upstream.GENERATE_ASYNC
    assert parameters(LLM.get_stats_async) == upstream.GET_STATS_ASYNC
    assert parameters(LLM.shutdown) == upstream.SHUTDOWN
    assert parameters(RequestOutput.abort) == upstream.REQUEST_OUTPUT_ABORT


def test_the_fields_and_defaults_are_upstreams():
    assert dataclass_fields(stand_in.SamplingParams) == upstream.SAMPLING_PARAMS
    assert dataclass_fields(stand_in.GuidedDecodingParams) == upstream.GUIDED_DECODING_PARAMS
    assert dataclass_fields(stand_in.LoRARequest) == upstream.LORA_REQUEST
    assert tuple(f.name for f in dataclasses.fields(CompletionOutput) if f.init) == upstream.COMPLETION_OUTPUT
    assert all(isinstance(getattr(CompletionOutput, name), property) for name in upstream.COMPLETION_OUTPUT_DIFFS)
    assert llm_args.TORCH_LLM_ARGS == {arg.name for arg in upstream_llm_args.TORCH_LLM_ARGS if arg.since == "A,B"}
    assert tuple(f.name for f in dataclasses.fields(llm_args.NGramDecodingConfig) if f.name != "decoding_type") == \
        upstream.NGRAM_DECODING_CONFIG
    assert set(llm_args.HONOURED) <= llm_args.TORCH_LLM_ARGS


def test_sampling_params_fill_pad_id_and_best_of_as_upstream():
    params = stand_in.SamplingParams(end_id=7)
    assert (params.pad_id, params.best_of, params.max_tokens) == (7, 1, 32)
    with pytest.raises(ValueError, match="best_of"):
        stand_in.SamplingParams(n=2, best_of=1)
    with pytest.raises(ValueError, match="Only one guide"):
        stand_in.SamplingParams(guided_decoding=stand_in.GuidedDecodingParams(regex="a", grammar="b"))


def test_llm_refuses_an_unknown_keyword_as_upstream():
    with pytest.raises(ValueError, match="LLM got invalid argument: max_batch_sizes"):
        LLM(str(MODEL), max_batch_sizes=4)


@pytest.mark.parametrize("kwargs, name", [
    ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
    ({"lora_config": {"lora_dir": [], "lora_ckpt_source": "nemo"}}, "lora_ckpt_source"),
    ({"lora_config": {"trtllm_modules_to_hf_modules": {"attn_q": "q"}}}, "trtllm_modules_to_hf_modules"),
    ({"lora_config": {"lora_dirs": []}}, "lora_config"),
    ({"enable_lora": True}, "enable_lora"),
    ({"speculative_config": {"decoding_type": "Eagle", "max_draft_len": 3}}, "decoding_type 'Eagle'"),
    ({"max_beam_width": 4}, "max_beam_width"),
])
def test_what_the_stand_in_cannot_do_is_refused_at_load_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LLM(str(MODEL), **kwargs)


@pytest.fixture(scope="module")
def llm():
    if not (MODEL / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    llm = LLM(str(MODEL), max_batch_size=4, enable_iter_perf_stats=True, guided_decoding_backend="xgrammar")
    yield llm
    llm.shutdown()


def run(coroutine):
    return asyncio.run(coroutine)


async def collect(output):
    return [(list(state.outputs[0].token_ids_diff), list(state.outputs[0].token_ids), state.finished)
            async for state in output]


PROMPT = [128000, 9906, 1917, 11, 358, 1097]


def test_streamed_outputs_are_cumulative_with_one_diff_per_step(llm):
    items = run(collect(llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=6, end_id=-1),
                                           streaming=True)))
    assert len(items) == 6 and [finished for *_, finished in items] == [False] * 5 + [True]
    assert all(len(diff) == 1 for diff, _, _ in items)
    assert items[-1][1] == [diff[0] for diff, _, _ in items]  # token_ids: every diff so far
    unstreamed = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=6, end_id=-1)).result()
    assert unstreamed.outputs[0].token_ids == items[-1][1]
    assert unstreamed.outputs[0].finish_reason == "length"


def test_logprobs_are_one_dict_per_token_and_the_cumulative_sum(llm):
    output = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=4, end_id=-1, logprobs=1)).result()
    completion = output.outputs[0]
    assert len(completion.logprobs) == 4
    assert all(isinstance(entry[token], Logprob) for entry, token in zip(completion.logprobs, completion.token_ids,
                                                                       strict=True))
    assert completion.cumulative_logprob == pytest.approx(sum(e[t].logprob for e, t in
                                                              zip(completion.logprobs, completion.token_ids,
                                                                  strict=True)))


def test_a_stop_token_ends_with_its_reason_and_is_cut_unless_asked(llm):
    plain = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=8, end_id=-1)).result().outputs[0]
    stop = plain.token_ids[3]
    cut = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=8, end_id=-1, stop_token_ids=[stop]))
    kept = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=8, end_id=-1, stop_token_ids=[stop],
                                                              include_stop_str_in_output=True))
    first = plain.token_ids.index(stop)
    assert cut.result().outputs[0].token_ids == plain.token_ids[:first]
    assert kept.result().outputs[0].token_ids == plain.token_ids[:first + 1]
    assert (kept.outputs[0].finish_reason, kept.outputs[0].stop_reason) == ("stop", stop)


def test_end_id_ends_without_the_token(llm):
    plain = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=8, end_id=-1)).result().outputs[0]
    ended = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=8, end_id=plain.token_ids[2])).result()
    first = plain.token_ids.index(plain.token_ids[2])
    assert ended.outputs[0].token_ids == plain.token_ids[:first]
    assert (ended.outputs[0].finish_reason, ended.outputs[0].stop_reason) == ("stop", None)


def test_abort_ends_the_request_as_cancelled(llm):
    async def abort_after_two():
        output = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=200, end_id=-1), streaming=True)
        seen = 0
        async for _state in output:
            seen += 1
            if seen == 2:
                output.abort()
        return output, seen

    output, seen = run(abort_after_two())
    assert output.aborted() and output.finished and output.outputs[0].finish_reason == "cancelled"
    assert seen < 200


@pytest.mark.parametrize("name, value", [("use_beam_search", True), ("min_p", 0.1), ("logprobs", 5),
                                         ("exclude_input_from_output", False), ("prompt_logprobs", 1)])
def test_what_the_stand_in_cannot_sample_is_refused_by_name(llm, name, value):
    with pytest.raises(ValueError, match=name):
        llm.generate_async(PROMPT, stand_in.SamplingParams(**{name: value}))


def test_a_lora_request_needs_the_llms_lora_config_and_an_existing_path(llm, tmp_path):
    with pytest.raises(ValueError, match="lora_request needs the LLM's lora_config"):
        llm.generate_async(PROMPT, lora_request=stand_in.LoRARequest("a", 1, str(tmp_path)))
    with pytest.raises(ValueError, match="lora_path .* does not exist"):
        stand_in.LoRARequest("a", 1, str(tmp_path / "missing"))


def test_a_lora_request_applies_its_peft_folder_as_peft_does(tmp_path):
    """LoraConfig as model.yaml gives it (a dict, through update_llm_args_with_extra_dict), adapters by path: greedy
    output with each adapter equals peft's generate() on the same weights; without one, the base model's; an
    adapter for modules the LLM was not configured for is refused naming them."""
    import copy

    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    from embedded_engine.checkpoint import load_checkpoint

    if not (MODEL / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    base = load_checkpoint(str(MODEL)).model
    for name, targets, seed in (("alpha", ["q_proj", "v_proj", "down_proj"], 1), ("beta", ["o_proj", "up_proj"], 2)):
        model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                               lora_dropout=0.0))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # non-zero A and B, float16-exact (the adapters are kept as float16)
            for parameter_name, parameter in model.named_parameters():
                if "lora_" in parameter_name:
                    parameter.copy_((torch.randn(parameter.shape, generator=generator) * 0.2).half().float())
        model.save_pretrained(str(tmp_path / name))

    def peft_greedy(name):
        model = base if name is None else PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path / name)).eval()
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, len(PROMPT)))
        return out[0, len(PROMPT):].tolist()

    args = stand_in.update_llm_args_with_extra_dict({}, {
        "model": str(MODEL), "max_batch_size": 4,
        "lora_config": {"lora_dir": [str(tmp_path / "alpha")], "lora_ckpt_source": "hf", "max_lora_rank": 8,
                        "lora_target_modules": ["attn_q", "attn_v", "mlp_4h_to_h", "attn_dense", "mlp_gate"],
                        "max_loras": 2, "max_cpu_loras": 2}})
    assert isinstance(args["lora_config"], llm_args.LoraConfig)
    llm = LLM(**args)
    try:
        greedy = stand_in.SamplingParams(max_tokens=8, end_id=-1)
        outputs = {}
        for task_id, name in ((None, None), (1, "alpha"), (2, "beta"), (1, "alpha")):
            lora = None if name is None else stand_in.LoRARequest(name, task_id, str(tmp_path / name))
            outputs[name] = llm.generate_async(PROMPT, greedy, lora_request=lora).result().outputs[0].token_ids
            assert outputs[name] == peft_greedy(name), name
        assert len({tuple(ids) for ids in outputs.values()}) == 3
    finally:
        llm.shutdown()
    narrow = LLM(**stand_in.update_llm_args_with_extra_dict({}, {
        "model": str(MODEL), "lora_config": {"lora_target_modules": ["attn_q"], "max_lora_rank": 8}}))
    try:
        with pytest.raises(ValueError, match="mlp_4h_to_h"):
            narrow.generate_async(PROMPT, lora_request=stand_in.LoRARequest("alpha", 1, str(tmp_path / "alpha")))
    finally:
        narrow.shutdown()


def test_guided_decoding_gives_json(llm):
    import json

    guide = stand_in.GuidedDecodingParams(json={"type": "object", "properties": {"a": {"type": "boolean"}},
                                                "required": ["a"]})
    output = llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=40, guided_decoding=guide)).result()
    assert output.outputs[0].finish_reason == "stop"
    assert isinstance(json.loads(output.outputs[0].text)["a"], bool)


def test_iteration_stats_carry_upstreams_keys(llm):
    llm.generate_async(PROMPT, stand_in.SamplingParams(max_tokens=3, end_id=-1)).result()

    async def stats():
        return [stat async for stat in llm.get_stats_async(timeout=0.2)]

    collected = run(stats())
    assert collected
    last = collected[-1]
    assert {"iter", "numActiveRequests", "maxNumActiveRequests", "numQueuedRequests", "kvCacheStats",
            "inflightBatchingStats"} <= set(last)
    assert last["maxNumActiveRequests"] == 4
    assert {"numScheduledRequests", "numContextRequests", "numGenRequests", "numCtxTokens"} <= \
        set(last["inflightBatchingStats"])


def test_ngram_speculation_gives_the_same_greedy_output():
    if not (MODEL / "config.json").is_file():
        pytest.skip("build/assets is missing: run `make repo`")
    prompt = PROMPT + PROMPT[1:] * 3
    params = dict(max_tokens=24, end_id=-1, return_perf_metrics=True)
    plain = LLM(str(MODEL))
    drafted = LLM(str(MODEL), **llm_args.update_llm_args_with_extra_dict({}, {"speculative_config": {
        "decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 2}}))
    try:
        expected = plain.generate_async(prompt, stand_in.SamplingParams(**params)).result().outputs[0]
        got = drafted.generate_async(prompt, stand_in.SamplingParams(**params)).result().outputs[0]
    finally:
        plain.shutdown()
        drafted.shutdown()
    assert got.token_ids == expected.token_ids
    assert got.request_perf_metrics.speculative_decoding.total_draft_tokens > 0
    assert expected.request_perf_metrics.speculative_decoding.total_draft_tokens == 0
