"""TensorRT-LLM 1.2.x's `LLM()` arguments (the PyTorch backend's TorchLlmArgs), recorded as data from its sources.

NVIDIA's Triton llmapi model passes model.yaml (minus `triton_config`) to `LLM(**update_llm_args_with_extra_dict({},
yaml))`; `BaseLLM.__init__` refuses a key that is not a TorchLlmArgs field ("LLM got invalid argument: <key>"), every
nested config is a pydantic StrictBaseModel (extra="forbid": an unknown nested key is a ValidationError) but LoraConfig,
a dataclass (an unknown key is a TypeError). `check-repo` (engine_build/check_repo.py) checks every key and value of a
repository's model.yaml against these tables, and the renderer (engine_build/llmapi_flow.py) writes nothing they lack
(tests/unit/test_llmapi_build.py holds it to them).

Sources. TensorRT-LLM 1.2.1's own commit (the triton-inference-server/TensorRT-LLM fork commit ca88df0 that
tensorrtllm_backend r26.07 pins, TENSORRTLLM_VER=1.2.1) is not readable in the stored copies, so the nearest versions
were read (../shared/reference/llmapi-1.2.md section 0 names them, section 1 lists the fields):
- A = NVIDIA/TensorRT-LLM@7b437aa tensorrt_llm/llmapi/llm_args.py (main at about 1.2.0rc1);
- B = 2ez4bz/TensorRT-LLM@249aee7 tensorrt_llm/llmapi/llm_args.py (a fork of main between 1.2.0rc2 and 1.3.0rc7);
- LoraConfig: NVIDIA/TensorRT-LLM@037d4ba tensorrt_llm/lora_helper.py (A and B import it from there).
The speculative configs were read again here in a stored 1.2-era llm_args.py (the search tool's file 1090804222, its
commit not shown): DecodingBaseConfig with speculative_model_dir, max_concurrency, load_format, acceptance_window,
acceptance_length_threshold; from_dict's keys MTP, Medusa, Eagle, Lookahead, NGram, DraftTarget, SaveState,
UserProvided, AUTO; Medusa's supports_backend excluding pytorch; NGram's max_matching_ngram_size default 0; as A.
A field in both A and B is recorded as accepted by 1.2.1 (`since="A,B"`); one in B only as likely (`since="B"`): we
never write those, and check-repo reports a B-only key as unverified rather than as an error. The one command that
settles the list in the 26.07 container:
    python -c "from tensorrt_llm.llmapi import TorchLlmArgs; print(sorted(TorchLlmArgs.model_fields))"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LLM_ARGS_A = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py@7b437aa"
LLM_ARGS_B = "2ez4bz/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py@249aee7"
LORA_HELPER = "NVIDIA/TensorRT-LLM tensorrt_llm/lora_helper.py@037d4ba"

# What a YAML value must be (as pydantic v2 reads it from yaml.safe_load's types). "path": a string naming a folder,
# relative to the model's version folder in our repositories; "model": a nested config (NESTED names its fields);
# "any": an object the YAML cannot usefully hold (a callable, a session); only its presence is checked.
Kind = Literal["bool", "int", "float", "str", "path", "literal", "int_list", "str_list", "str_map", "dict", "model",
               "any"]


@dataclass(frozen=True)
class LlmArg:
    """One pydantic field (or dataclass field) of an LLM() argument class."""

    name: str
    kind: Kind
    default: object
    optional: bool = False  # Optional[...]: null is accepted
    choices: tuple[str, ...] | None = None  # literal: the accepted strings
    minimum: float | None = None  # ge
    exclusive_minimum: float | None = None  # gt
    maximum: float | None = None  # le
    nested: str | None = None  # model: the NESTED class
    since: str = "A,B"  # which of the read versions has it (module docstring)


def _a(name, kind, default, **kw) -> LlmArg:
    return LlmArg(name, kind, default, **kw)


# BaseLlmArgs and TorchLlmArgs together: the fields LLM(backend="pytorch") takes (A and B, llmapi-1.2.md section 1).
TORCH_LLM_ARGS: tuple[LlmArg, ...] = (
    _a("model", "path", None),
    _a("tokenizer", "path", None, optional=True),
    _a("tokenizer_mode", "literal", "auto", choices=("auto", "slow")),
    _a("skip_tokenizer_init", "bool", False),
    _a("trust_remote_code", "bool", False),
    _a("tensor_parallel_size", "int", 1, minimum=1),
    _a("dtype", "str", "auto"),
    _a("revision", "str", None, optional=True),
    _a("tokenizer_revision", "str", None, optional=True),
    _a("pipeline_parallel_size", "int", 1, minimum=1),
    _a("context_parallel_size", "int", 1, minimum=1),
    _a("gpus_per_node", "int", None, optional=True),
    _a("moe_cluster_parallel_size", "int", None, optional=True),
    _a("moe_tensor_parallel_size", "int", None, optional=True),
    _a("moe_expert_parallel_size", "int", None, optional=True),
    _a("enable_attention_dp", "bool", False),
    _a("enable_lm_head_tp_in_adp", "bool", False),
    _a("cp_config", "dict", {}, optional=True),
    _a("load_format", "literal", "AUTO", choices=("AUTO", "DUMMY", "VISION_ONLY", "auto", "dummy", "vision_only")),
    _a("fail_fast_on_attention_window_too_large", "bool", False),
    _a("enable_lora", "bool", False),
    _a("lora_config", "model", None, optional=True, nested="LoraConfig"),
    _a("kv_cache_config", "model", {}, nested="KvCacheConfig"),
    _a("enable_chunked_prefill", "bool", False),
    _a("guided_decoding_backend", "literal", None, optional=True, choices=("xgrammar", "llguidance")),
    _a("batched_logits_processor", "any", None, optional=True),
    _a("iter_stats_max_iterations", "int", None, optional=True),
    _a("request_stats_max_iterations", "int", None, optional=True),
    _a("peft_cache_config", "dict", None, optional=True),
    _a("scheduler_config", "model", {}, nested="SchedulerConfig"),
    _a("cache_transceiver_config", "dict", None, optional=True),
    _a("sparse_attention_config", "dict", None, optional=True),
    _a("speculative_config", "model", None, optional=True, nested="speculative_config"),
    _a("max_batch_size", "int", 2048, optional=True, minimum=1),
    _a("max_input_len", "int", 1024, optional=True, minimum=1),
    _a("max_seq_len", "int", None, optional=True, minimum=1),
    _a("max_beam_width", "int", 1, optional=True, minimum=1),
    _a("max_num_tokens", "int", 8192, optional=True, minimum=1),
    _a("gather_generation_logits", "bool", False),
    _a("num_postprocess_workers", "int", 0, minimum=0),
    _a("postprocess_tokenizer_dir", "path", None, optional=True),
    _a("reasoning_parser", "str", None, optional=True),
    _a("decoding_config", "any", None, optional=True),
    _a("backend", "literal", None, optional=True, choices=("pytorch",)),
    _a("return_perf_metrics", "bool", False),
    _a("orchestrator_type", "literal", None, optional=True, choices=("rpc", "ray")),
    # TorchLlmArgs
    _a("garbage_collection_gen0_threshold", "int", 20000),
    _a("cuda_graph_config", "model", {}, optional=True, nested="CudaGraphConfig"),
    _a("attention_dp_config", "dict", None, optional=True),
    _a("disable_overlap_scheduler", "bool", False),
    _a("moe_config", "dict", {}),
    _a("attn_backend", "str", "TRTLLM"),
    _a("sampler_type", "literal", "auto", choices=("TRTLLMSampler", "TorchSampler", "auto")),
    _a("enable_iter_perf_stats", "bool", False),
    _a("enable_iter_req_stats", "bool", False),
    _a("print_iter_log", "bool", False),
    _a("batch_wait_timeout_ms", "float", 0, minimum=0),
    _a("batch_wait_timeout_iters", "int", 0, minimum=0),
    _a("batch_wait_max_tokens_ratio", "float", 0, minimum=0, maximum=1),
    _a("torch_compile_config", "dict", None, optional=True),
    _a("enable_autotuner", "bool", True),
    _a("enable_layerwise_nvtx_marker", "bool", False),
    _a("enable_min_latency", "bool", False),
    _a("stream_interval", "int", 1, exclusive_minimum=0),
    _a("force_dynamic_quantization", "bool", False),
    _a("allreduce_strategy", "str", "AUTO", optional=True),
    _a("checkpoint_loader", "any", None, optional=True),
    _a("checkpoint_format", "str", None, optional=True),
    _a("kv_connector_config", "dict", None, optional=True),
    _a("mm_encoder_only", "bool", False),
    _a("perf_metrics_max_requests", "int", 0, minimum=0),
    # B only (likely in 1.2.1, never written by us)
    *(LlmArg(name, "any", None, optional=True, since="B") for name in (
        "custom_tokenizer", "model_kwargs", "pp_partition", "otlp_traces_endpoint", "env_overrides",
        "nvfp4_gemm_config", "sampler_force_async_worker", "ray_worker_extension_cls", "ray_placement_config",
        "enable_sleep", "use_cute_dsl_blockscaling_mm", "use_cute_dsl_blockscaling_bmm",
        "disable_flashinfer_sampling", "max_stats_len", "layer_wise_benchmarks_config")),
)

# The nested configs we write or check field by field (llmapi-1.2.md section 1.1; A and B unless marked).
NESTED: dict[str, tuple[LlmArg, ...]] = {
    "KvCacheConfig": (
        _a("enable_block_reuse", "bool", True),
        _a("max_tokens", "int", None, optional=True, minimum=1),
        _a("max_attention_window", "int_list", None, optional=True),
        _a("sink_token_length", "int", None, optional=True),
        _a("free_gpu_memory_fraction", "float", 0.9, optional=True, minimum=0, maximum=1),
        _a("host_cache_size", "int", None, optional=True, minimum=0),
        _a("onboard_blocks", "bool", True),
        _a("cross_kv_cache_fraction", "float", None, optional=True),
        _a("secondary_offload_min_priority", "int", None, optional=True),
        _a("event_buffer_max_size", "int", 0, minimum=0),
        _a("attention_dp_events_gather_period_ms", "int", 5),
        _a("enable_partial_reuse", "bool", True),
        _a("copy_on_partial_reuse", "bool", True),
        _a("use_uvm", "bool", False),
        _a("max_gpu_total_bytes", "int", 0, minimum=0),
        # PyTorch only; "fp8" sets quant_config.kv_cache_quant_algo=FP8 (sync_quant_config_with_kv_cache_config_dtype)
        _a("dtype", "str", "auto"),
        _a("mamba_ssm_cache_dtype", "str", "auto"),
        _a("tokens_per_block", "int", 32, minimum=1),
        LlmArg("use_kv_cache_manager_v2", "bool", False, since="B"),
        LlmArg("max_util_for_resume", "float", 0.95, since="B"),
    ),
    "CudaGraphConfig": (
        _a("batch_sizes", "int_list", None, optional=True),
        _a("max_batch_size", "int", 0, minimum=0),
        _a("enable_padding", "bool", False),
    ),
    "SchedulerConfig": (
        _a("capacity_scheduler_policy", "literal", "GUARANTEED_NO_EVICT",
           choices=("GUARANTEED_NO_EVICT", "MAX_UTILIZATION", "STATIC_BATCH")),
        _a("context_chunking_policy", "literal", None, optional=True,
           choices=("FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS")),
        _a("dynamic_batch_config", "dict", None, optional=True),
    ),
    # A dataclass (lora_helper.py@037d4ba), not pydantic: LoraConfig(**d) raises TypeError on an unknown key.
    "LoraConfig": (
        _a("lora_dir", "str_list", []),
        _a("lora_ckpt_source", "literal", "hf", choices=("hf", "nemo")),
        _a("max_lora_rank", "int", 64, minimum=1),
        _a("lora_target_modules", "str_list", []),
        _a("trtllm_modules_to_hf_modules", "str_map", {}),
        _a("max_loras", "int", None, optional=True, minimum=1),
        _a("max_cpu_loras", "int", None, optional=True, minimum=1),
        _a("swap_gate_up_proj", "bool", True),
    ),
}

# DecodingBaseConfig's fields (A; B renames speculative_model_dir to speculative_model and keeps
# speculative_model_dir as its validation alias, so we write speculative_model_dir, which both take).
DECODING_BASE = (
    _a("decoding_type", "str", None),
    _a("max_draft_len", "int", None, optional=True, minimum=0),
    _a("max_total_draft_tokens", "int", None, optional=True),
    _a("speculative_model_dir", "path", None, optional=True),
    _a("max_concurrency", "int", None, optional=True, exclusive_minimum=0),
    _a("load_format", "str", None, optional=True),
    _a("acceptance_window", "int", None, optional=True),
    _a("acceptance_length_threshold", "float", None, optional=True),
)
EAGLE_FIELDS = (
    _a("eagle_choices", "any", None, optional=True),
    _a("greedy_sampling", "bool", True, optional=True),
    _a("posterior_threshold", "float", None, optional=True),
    _a("use_dynamic_tree", "bool", False, optional=True),
    _a("dynamic_tree_max_topK", "int", None, optional=True),
    _a("num_eagle_layers", "int", None, optional=True),
    _a("max_non_leaves_per_layer", "int", None, optional=True),
    _a("eagle3_one_model", "bool", True, optional=True),
    _a("eagle3_layers_to_capture", "any", None, optional=True),
)
# speculative_config's `decoding_type` -> (its class, its own fields, whether the PyTorch backend takes it; why not).
# DecodingBaseConfig.from_dict dispatches on decoding_type (A, B); Lookahead's and Medusa's supports_backend exclude
# pytorch (ValueError at LLM()).
SPECULATIVE_DECODING_TYPES: dict[str, tuple[str, tuple[LlmArg, ...], str | None]] = {
    # EagleDecodingConfig: EAGLE-3 on the PyTorch backend (A); B warns that `Eagle` is treated as Eagle3.
    "Eagle": ("EagleDecodingConfig", EAGLE_FIELDS, None),
    "NGram": ("NGramDecodingConfig", (
        _a("max_matching_ngram_size", "int", 0, exclusive_minimum=0),
        _a("is_keep_all", "bool", True),
        _a("is_use_oldest", "bool", True),
        _a("is_public_pool", "bool", True),
    ), None),
    "DraftTarget": ("DraftTargetDecodingConfig", (), None),
    "Lookahead": ("LookaheadDecodingConfig", (), "LookaheadDecodingConfig.supports_backend excludes pytorch: the "
                  "PyTorch flow refuses it (lookahead is the engine flow's, ENGINE=trtllm)"),
    "Medusa": ("MedusaDecodingConfig", (), "MedusaDecodingConfig.supports_backend excludes pytorch: the PyTorch "
               "flow refuses it"),
}
# B only: Eagle3DecodingConfig ("Eagle3"). We write "Eagle", which A and B both take for EAGLE-3.
SPECULATIVE_B_ONLY = ("Eagle3",)

# NVIDIA's Triton llmapi model's own section of model.yaml (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
# @044a90d and model.yaml@c8c6df0, llmapi-1.2.md section 6): popped before LLM() sees the rest.
TRITON_CONFIG_SOURCE = ("NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm/1/model.py@044a90d, "
                        "model.yaml@c8c6df0")
TRITON_CONFIG = (
    _a("max_batch_size", "int", 0, minimum=0),
    _a("decoupled", "bool", False),
    _a("cancellation_check_period_ms", "int", 100, exclusive_minimum=0),
)


def torch_llm_arg(name: str) -> LlmArg | None:
    return next((arg for arg in TORCH_LLM_ARGS if arg.name == name), None)


def value_problem(arg: LlmArg, value: object) -> str | None:
    """Why `value` (from yaml.safe_load) is not what the field takes (None when it is)."""
    if value is None:
        return None if arg.optional else "null, but the field is not Optional"
    kind = arg.kind
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "path": isinstance(value, str) and bool(value),
        "literal": isinstance(value, str),
        "int_list": isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "str_list": isinstance(value, list) and all(isinstance(v, str) for v in value),
        "str_map": isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in value.items()),
        "dict": isinstance(value, dict),
        "model": isinstance(value, dict),
        "any": True,
    }[kind]
    if not ok:
        wanted = {"int_list": "list of ints", "str_list": "list of strings", "str_map": "mapping of strings",
                  "model": "mapping", "literal": "string", "path": "non-empty string"}.get(kind, kind)
        return f"{value!r} is not a {wanted}"
    if arg.choices is not None and value not in arg.choices:
        return f"{value!r} is none of {list(arg.choices)}"
    if kind in ("int", "float"):
        if arg.minimum is not None and value < arg.minimum:
            return f"{value!r} is below its minimum {arg.minimum:g}"
        if arg.exclusive_minimum is not None and value <= arg.exclusive_minimum:
            return f"{value!r} must be above {arg.exclusive_minimum:g}"
        if arg.maximum is not None and value > arg.maximum:
            return f"{value!r} is above its maximum {arg.maximum:g}"
    return None


def fields_problems(fields: tuple[LlmArg, ...], values: dict, where: str, owner: str) -> tuple[list[str], list[str]]:
    """(problems, unverified) of a mapping against `fields`: an unknown key, a wrong type or value; keys recorded
    only in B are unverified. Nested configs are checked recursively (speculative_config by its decoding_type)."""
    by_name = {arg.name: arg for arg in fields}
    problems, unverified = [], []
    for key, value in values.items():
        path = f"{where}{key}"
        arg = by_name.get(key)
        if arg is None:
            problems.append(f"{path}: {owner} has no field {key!r} (a typo? unknown keys are refused at load)")
            continue
        if arg.since != "A,B":
            unverified.append(f"{path}: recorded only in {LLM_ARGS_B} (likely, not certain, in 1.2.1)")
        problem = value_problem(arg, value)
        if problem:
            problems.append(f"{path}: {problem}")
            continue
        if arg.kind == "model" and isinstance(value, dict):
            if arg.nested == "speculative_config":
                nested_problems, nested_unverified = speculative_problems(value, f"{path}.")
            else:
                nested_problems, nested_unverified = fields_problems(NESTED[arg.nested], value, f"{path}.",
                                                                     arg.nested)
            problems += nested_problems
            unverified += nested_unverified
    return problems, unverified


def speculative_problems(values: dict, where: str) -> tuple[list[str], list[str]]:
    decoding_type = values.get("decoding_type")
    if decoding_type in SPECULATIVE_B_ONLY:
        return [], [f"{where}decoding_type: {decoding_type!r} is recorded only in {LLM_ARGS_B}; 'Eagle' is EAGLE-3 "
                    "in both read versions"]
    if decoding_type not in SPECULATIVE_DECODING_TYPES:
        return [f"{where}decoding_type: {decoding_type!r} is none of {sorted(SPECULATIVE_DECODING_TYPES)} "
                "(DecodingBaseConfig.from_dict dispatches on it)"], []
    class_name, own, refused = SPECULATIVE_DECODING_TYPES[decoding_type]
    if refused:
        return [f"{where}decoding_type: {decoding_type}: {refused}"], []
    return fields_problems((*DECODING_BASE, *own), values, where, class_name)


def llm_args_problems(model_yaml: dict) -> tuple[list[str], list[str]]:
    """Every key and value of a model.yaml (LLM() arguments + triton_config) against the records."""
    if not isinstance(model_yaml, dict):
        return [f"the document is a {type(model_yaml).__name__}, not a mapping of LLM() arguments"], []
    args = {key: value for key, value in model_yaml.items() if key != "triton_config"}
    problems, unverified = fields_problems(TORCH_LLM_ARGS, args, "", "TorchLlmArgs")
    if "model" not in args:
        problems.append("model: missing (LLM()'s one required argument)")
    triton = model_yaml.get("triton_config")
    if not isinstance(triton, dict):
        problems.append("triton_config: missing or not a mapping (the Triton model reads max_batch_size and "
                        "decoupled from it)")
    else:
        triton_problems, _ = fields_problems(TRITON_CONFIG, triton, "triton_config.", "the Triton model's "
                                                                                        "triton_config")
        problems += triton_problems
    return problems, unverified
