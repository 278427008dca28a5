"""What the 26.07 container's backends read from our configs' `parameters`, recorded as data from their sources.

Triton hands a model's config to its backend; the backend reads each `parameters` entry by name. The tensorrtllm
C++ backend (TensorRT-LLM 1.2.1, the 26.07 container's) reads every one through `ModelState::GetParameter<T>`,
which throws "Cannot find parameter with name: X" for a key the config lacks and converts the string with
std::stoi/stof/... (or "True/true/TRUE/1", "False/false/FALSE/0" for bool), throwing on anything else. A read inside
a try/catch falls back to a default (logged as a warning); a read outside one fails the model instance, so the model,
and the ensemble that steps through it, never load. `check-repo` (engine_build/check_repo.py) and the renderer
(engine_build/repository.py) both work from these tables; tests/unit/test_upstream_parameters.py holds our template
to UPSTREAM_TEMPLATE_PARAMETERS.

Sources (read 2026-11-25 through the search tool's stored copies; the exact commit of TensorRT-LLM's `v1.2.1` tag and
of the triton-inference-server/TensorRT-LLM fork commit ca88df0 that tensorrtllm_backend r26.07 pins as its
`tensorrt_llm` submodule are not in the store, so the newest stored copies of the 1.2-era files were read):
- NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/model_instance_state.cc @ c8c6df08 (its
  getGuidedDecodingConfigFromParams is the same at 0c8de69), model_state.cc @ 5cdd6921, model_state.h @ 7d5c4458,
  libtensorrtllm.cc @ c8c6df08 (reads no parameter). utils.cc (request tensors) was not read for parameters.
- NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt @ 2a9abd95: the
  template, its 45 keys in order and the value it leaves in each (`${...}` for what a deployment sets).
- triton-inference-server/python_backend src/python_be.cc @ 0ccc7643, ModelState::ModelState: the Python backend's
  reads (EXECUTION_ENV_PATH, FORCE_CPU_ONLY_INPUT_TENSORS, model_transaction_policy.decoupled).
- triton-inference-server/tensorrtllm_backend r26.07 (3bc1153) docs/model_config.md (the guided-decoding keys) and
  docs/guided_decoding.md ("C++ Backend": fill guided_decoding_backend and xgrammar_tokenizer_info_path, the file made
  by examples/generate_xgrammar_tokenizer_info.py; tokenizer_dir is for the Python backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TRTLLM_SRC = "NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src"
MODEL_INSTANCE_STATE = f"{TRTLLM_SRC}/model_instance_state.cc@c8c6df08"
MODEL_STATE = f"{TRTLLM_SRC}/model_state.cc@5cdd6921"
UPSTREAM_TEMPLATE = ("NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"
                     "@2a9abd95")
PYTHON_BACKEND = "triton-inference-server/python_backend src/python_be.cc@0ccc7643 ModelState::ModelState"

# How GetParameter<T> converts the string (model_state.cc's specialisations): what a value must look like.
ValueKind = Literal["string", "path", "bool", "int", "uint", "float", "int_list", "int_list_list", "device_groups"]


@dataclass(frozen=True)
class ParameterRead:
    """One `GetParameter<cpp_type>(name)` of the backend.

    guarded: inside a try/catch (a missing key or a value that does not convert falls back to `default`); else a
    missing key fails the model's load. accepted: the values the code distinguishes (None: any value of `kind`).
    """

    name: str
    cpp_type: str
    kind: ValueKind
    guarded: bool
    default: str
    source: str
    accepted: tuple[str, ...] | None = None
    note: str = ""

    @property
    def fatal_when_missing(self) -> bool:
        return not self.guarded


def _read(name, cpp_type, kind, guarded, default, function, source=MODEL_INSTANCE_STATE, **kw) -> ParameterRead:
    return ParameterRead(name, cpp_type, kind, guarded, default, f"{source} {function}", **kw)


GATED = "ModelInstanceState::getExecutorConfigFromParams"
# Every parameter the 1.2.1 tensorrtllm backend reads, in the order it reads them at load.
TENSORRT_LLM_PARAMETER_READS: tuple[ParameterRead, ...] = (
    _read("gpu_device_ids", "std::string", "device_groups", True, "automatic",
          "ModelState::LoadParameters", source=MODEL_STATE,
          note="';'-separated groups (one per instance) of comma-separated device ids"),
    _read("participant_ids", "std::string", "device_groups", True, "automatic",
          "ModelState::LoadParameters", source=MODEL_STATE,
          note="';'-separated groups of comma-separated MPI ranks; required when orchestrator mode does not spawn"),
    _read("gpt_model_type", "std::string", "string", False, "none: the load fails",
          "ModelInstanceState::getBatchingTypeFromParams",
          accepted=("V1", "v1", "inflight_batching", "inflight_fused_batching"),
          note="any other value throws 'Invalid gpt_model_type' outside a try: the load fails"),
    _read("max_tokens_in_paged_kv_cache", "int32_t", "int", True, "unset (the fraction decides)",
          "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("kv_cache_free_gpu_mem_fraction", "float", "float", True, "0.9",
          "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("cross_kv_cache_fraction", "float", "float", True, "unset (encoder-decoder only)",
          "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("kv_cache_host_memory_bytes", "size_t", "uint", True, "0", "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("kv_cache_onboard_blocks", "bool", "bool", True, "true", "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("max_attention_window_size", "std::vector<int32_t>", "int_list", True, "max_sequence_length",
          "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("sink_token_length", "int32_t", "int", True, "unset", "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("enable_kv_cache_reuse", "bool", "bool", True, "true", "ModelInstanceState::getKvCacheConfigFromParams"),
    _read("multi_block_mode", "bool", "bool", True, "true",
          "ModelInstanceState::getExtendedRuntimePerfKnobConfigFromParams"),
    _read("enable_context_fmha_fp32_acc", "bool", "bool", True, "false",
          "ModelInstanceState::getExtendedRuntimePerfKnobConfigFromParams"),
    _read("cuda_graph_mode", "bool", "bool", True, "false",
          "ModelInstanceState::getExtendedRuntimePerfKnobConfigFromParams"),
    _read("cuda_graph_cache_size", "SizeType32", "int", True, "0",
          "ModelInstanceState::getExtendedRuntimePerfKnobConfigFromParams"),
    _read("num_nodes", "int32_t", "int", True, "1", "ModelInstanceState::getParallelConfigFromParams"),
    _read("worker_path", "std::string", "string", True, "absent",
          "ModelState::GetExecutorWorkerPath", source=MODEL_STATE,
          note="orchestrator mode only; present, it throws inside its own try, which swallows it: no effect"),
    _read("executor_worker_path", "std::string", "path", True,
          "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker", "ModelState::GetExecutorWorkerPath",
          source=MODEL_STATE, note="orchestrator mode only (TRTLLM_ORCHESTRATOR=1)"),
    _read("lora_cache_max_adapter_size", "SizeType32", "int", True, "64",
          "ModelInstanceState::getPeftCacheConfigFromParams",
          note="clamped to the engine's max_lora_rank (lora-1.2.md section 5)"),
    _read("lora_cache_optimal_adapter_size", "SizeType32", "int", True, "8",
          "ModelInstanceState::getPeftCacheConfigFromParams",
          note="the rank one cache page fits; clamped to the engine's max_lora_rank"),
    _read("lora_cache_gpu_memory_fraction", "float", "float", True, "0.05",
          "ModelInstanceState::getPeftCacheConfigFromParams"),
    _read("lora_cache_host_memory_bytes", "size_t", "uint", True, "1 GB",
          "ModelInstanceState::getPeftCacheConfigFromParams"),
    _read("lora_prefetch_dir", "std::string", "string", True, "unset",
          "ModelInstanceState::getPeftCacheConfigFromParams",
          note="opened as given (absolute where served); every <dir>/<task id digits>/ holding model.lora_weights.npy "
               "and model.lora_config.npy goes into the host cache at start-up (prefetchLoraWeights), other folder "
               "names are skipped with a warning; engine_build/lora.py writes this layout"),
    _read("batch_scheduler_policy", "std::string", "string", True, "guaranteed_no_evict",
          "ModelInstanceState::getSchedulerConfigFromParams", accepted=("max_utilization", "guaranteed_no_evict"),
          note="another value is logged and replaced by the default"),
    _read("speculative_decoding_fast_logits", "bool", "bool", True, "false",
          "ModelInstanceState::getSpeculativeDecodingConfigFromParams"),
    _read("max_beam_width", "int32_t", "int", True, "1", GATED),
    _read("iter_stats_max_iterations", "int32_t", "int", True, "ExecutorConfig::kDefaultIterStatsMaxIterations",
          GATED),
    _read("request_stats_max_iterations", "int32_t", "int", True,
          "ExecutorConfig::kDefaultRequestStatsMaxIterations", GATED),
    _read("enable_trt_overlap", "bool", "bool", True, "ignored", GATED, note="deprecated: read, then ignored"),
    _read("normalize_log_probs", "bool", "bool", True, "true", GATED),
    _read("enable_chunked_context", "bool", "bool", True, "false", GATED,
          note="true needs an engine built with use_paged_context_fmha"),
    _read("decoding_mode", "std::string", "string", True, "top_k_top_p (beam_search when max_beam_width > 1)",
          GATED, accepted=("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead",
                           "eagle"), note="another value is logged and replaced by the default"),
    _read("medusa_choices", "MedusaChoices", "int_list_list", True, "mc_sim_7b_63", GATED),
    _read("eagle_choices", "EagleChoices", "int_list_list", True, "per request", GATED),
    _read("lookahead_window_size", "uint32_t", "uint", True, "none", GATED,
          note="read only with decoding_mode lookahead, and then a missing one fails the load"),
    _read("lookahead_ngram_size", "uint32_t", "uint", True, "none", GATED,
          note="read only with decoding_mode lookahead, and then a missing one fails the load"),
    _read("lookahead_verification_set_size", "uint32_t", "uint", True, "none", GATED,
          note="read only with decoding_mode lookahead, and then a missing one fails the load"),
    _read("gpu_weights_percent", "float", "float", True, "1.0", GATED),
    _read("recv_poll_period_ms", "int", "int", True, "0 (busy loop)", GATED,
          note="not declared by upstream's template"),
    _read("tokenizer_dir", "std::string", "string", False, "none: the load fails",
          "ModelInstanceState::getGuidedDecodingConfigFromParams",
          note="read outside any try; set, it is only logged ('the C++ workflow does not use tokenizer_dir')"),
    _read("xgrammar_tokenizer_info_path", "std::string", "path", False, "none: the load fails",
          "ModelInstanceState::getGuidedDecodingConfigFromParams",
          note="read outside any try; with guided_decoding_backend set, the file must exist (TLLM_CHECK) and be JSON "
               "with encoded_vocab (list of strings), tokenizer_str (string), stop_token_ids (list of ints)"),
    _read("guided_decoding_backend", "std::string", "string", False, "none: the load fails",
          "ModelInstanceState::getGuidedDecodingConfigFromParams", accepted=("xgrammar",),
          note="read outside any try; set (with a tokenizer info path) to anything but xgrammar, TLLM_THROW fails the "
               "load; unset (or the info path unset), guided decoding is off"),
    _read("gpt_model_path", "std::string", "path", True, "empty", "ModelInstanceState::ModelInstanceState",
          note="the existence check is inside the try too: a missing or absent path leaves it empty, and with no "
               "encoder_model_path the load fails with 'Both encoder and decoder model paths are empty'"),
    _read("encoder_model_path", "std::string", "path", True, "empty", "ModelInstanceState::ModelInstanceState"),
    _read("exclude_input_in_output", "bool", "bool", True, "false", "ModelInstanceState::ModelInstanceState"),
    _read("cancellation_check_period_ms", "int", "int", True, "100", "ModelInstanceState::ModelInstanceState"),
    _read("stats_check_period_ms", "int", "int", True, "100", "ModelInstanceState::ModelInstanceState"),
)
PARAMETER_READS = {read.name: read for read in TENSORRT_LLM_PARAMETER_READS}
# getGuidedDecodingConfigFromParams treats an empty value, or the template's own placeholder left in place, as unset
# (the comparison is with "${<key>}"); the other guarded reads fail to convert "${...}" and take their default.
GUIDED_DECODING_KEYS = ("tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend")
XGRAMMAR_TOKENIZER_INFO_FIELDS = {"encoded_vocab": "list of strings", "tokenizer_str": "string",
                                  "stop_token_ids": "list of ints"}

# Upstream's template: every parameter key, in order, with the value the template writes (a `${placeholder}` for what
# fill_template.py fills; where a deployment fills nothing, the text stays `${placeholder}`, which the backend reads as
# described above). enable_trt_overlap is commented out there.
UPSTREAM_TEMPLATE_PARAMETERS: tuple[tuple[str, str], ...] = (
    ("max_beam_width", "${max_beam_width}"),
    ("FORCE_CPU_ONLY_INPUT_TENSORS", "no"),
    ("gpt_model_type", "${batching_strategy}"),
    ("gpt_model_path", "${engine_dir}"),
    ("encoder_model_path", "${encoder_engine_dir}"),
    ("max_tokens_in_paged_kv_cache", "${max_tokens_in_paged_kv_cache}"),
    ("max_attention_window_size", "${max_attention_window_size}"),
    ("sink_token_length", "${sink_token_length}"),
    ("batch_scheduler_policy", "${batch_scheduler_policy}"),
    ("kv_cache_free_gpu_mem_fraction", "${kv_cache_free_gpu_mem_fraction}"),
    ("cross_kv_cache_fraction", "${cross_kv_cache_fraction}"),
    ("kv_cache_host_memory_bytes", "${kv_cache_host_memory_bytes}"),
    ("kv_cache_onboard_blocks", "${kv_cache_onboard_blocks}"),
    ("exclude_input_in_output", "${exclude_input_in_output}"),
    ("cancellation_check_period_ms", "${cancellation_check_period_ms}"),
    ("stats_check_period_ms", "${stats_check_period_ms}"),
    ("iter_stats_max_iterations", "${iter_stats_max_iterations}"),
    ("request_stats_max_iterations", "${request_stats_max_iterations}"),
    ("enable_kv_cache_reuse", "${enable_kv_cache_reuse}"),
    ("normalize_log_probs", "${normalize_log_probs}"),
    ("enable_chunked_context", "${enable_chunked_context}"),
    ("gpu_device_ids", "${gpu_device_ids}"),
    ("participant_ids", "${participant_ids}"),
    ("num_nodes", "${num_nodes}"),
    ("lora_cache_optimal_adapter_size", "${lora_cache_optimal_adapter_size}"),
    ("lora_cache_max_adapter_size", "${lora_cache_max_adapter_size}"),
    ("lora_cache_gpu_memory_fraction", "${lora_cache_gpu_memory_fraction}"),
    ("lora_cache_host_memory_bytes", "${lora_cache_host_memory_bytes}"),
    ("lora_prefetch_dir", "${lora_prefetch_dir}"),
    ("decoding_mode", "${decoding_mode}"),
    ("executor_worker_path", "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"),
    ("lookahead_window_size", "${lookahead_window_size}"),
    ("lookahead_ngram_size", "${lookahead_ngram_size}"),
    ("lookahead_verification_set_size", "${lookahead_verification_set_size}"),
    ("medusa_choices", "${medusa_choices}"),
    ("eagle_choices", "${eagle_choices}"),
    ("gpu_weights_percent", "${gpu_weights_percent}"),
    ("enable_context_fmha_fp32_acc", "${enable_context_fmha_fp32_acc}"),
    ("multi_block_mode", "${multi_block_mode}"),
    ("cuda_graph_mode", "${cuda_graph_mode}"),
    ("cuda_graph_cache_size", "${cuda_graph_cache_size}"),
    ("speculative_decoding_fast_logits", "${speculative_decoding_fast_logits}"),
    ("tokenizer_dir", "${tokenizer_dir}"),
    ("guided_decoding_backend", "${guided_decoding_backend}"),
    ("xgrammar_tokenizer_info_path", "${xgrammar_tokenizer_info_path}"),
)
# Declared by the template, read by no code of inflight_batcher_llm/src that was read (the Python backend reads a key of
# this name; the C++ backend's read, if any, would be in a file not read): kept as upstream writes it.
TEMPLATE_ONLY_KEYS = ("FORCE_CPU_ONLY_INPUT_TENSORS",)


def upstream_placeholder(key: str) -> str | None:
    """The placeholder upstream's template leaves in `key` (None where it writes a literal value)."""
    value = dict(UPSTREAM_TEMPLATE_PARAMETERS)[key]
    return value[2:-1] if value.startswith("${") and value.endswith("}") else None


def is_unset(key: str, value: str) -> bool:
    """Whether the backend treats `value` of `key` as not given: empty, or the template's placeholder left in place
    (getGuidedDecodingConfigFromParams compares with exactly that; the typed reads fail to convert it)."""
    placeholder = upstream_placeholder(key) if key in dict(UPSTREAM_TEMPLATE_PARAMETERS) else key
    return value == "" or value == f"${{{placeholder}}}" or value == f"${{{key}}}"


@dataclass(frozen=True)
class PythonBackendRead:
    name: str
    accepted: tuple[str, ...] | None
    fatal: str
    note: str


# The Python backend (every `backend: "python"` model of ours) reads these from `parameters`; both are optional.
PYTHON_BACKEND_PARAMETER_READS: tuple[PythonBackendRead, ...] = (
    PythonBackendRead("EXECUTION_ENV_PATH", None, "the stub cannot start when the path is not a conda-pack environment",
                      "optional; $$TRITON_MODEL_DIRECTORY is replaced by the model's directory. We ship none: the "
                      "models run on the container's own Python"),
    PythonBackendRead("FORCE_CPU_ONLY_INPUT_TENSORS", ("yes", "no"), "another value throws: the load fails",
                      "optional; default yes"),
)
