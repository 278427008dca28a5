"""TensorRT-LLM 1.2.x's LLM API, recorded as data (no network at test time): the signatures and fields the llmapi
flow calls and sets, and NVIDIA's llmapi model's tensor names. The stand-in (llmapi_engine/stand_in) is held to
these, and so is every call the llmapi model makes (tests/unit/test_llmapi_stand_in.py, test_llmapi_calls.py).

Read 2026-11-28 in the stored copies of NVIDIA/TensorRT-LLM (1.2.1's own tag is not readable here: see
/work/shared/reference/llmapi-1.2.md §0 for which nearby version each fact comes from):
- tensorrt_llm/llmapi/llm.py: `LLM.__init__` read at 00966934 (model, tokenizer, tokenizer_mode,
  skip_tokenizer_init, trust_remote_code, tensor_parallel_size, dtype, revision, tokenizer_revision, **kwargs);
  `generate_async` as at 4c05a74 (llmapi-1.2.md §3; 00966934 is older: it has `queries` and no scheduling_params /
  cache_salt). `get_stats_async(timeout=2)`, `shutdown()`: llmapi-1.2.md §7.
- tensorrt_llm/sampling_params.py: SamplingParams' fields in order, as at b35ac1b (1.2.0rc2; llmapi-1.2.md §4), read
  at 000a01de, which lacks prompt_ignore_length only; GuidedDecodingParams.
- tensorrt_llm/executor/result.py read at 005bc84: CompletionOutput's fields (request_perf_metrics as NVIDIA's
  llmapi model reads it, @b35ac1b), Logprob(logprob, rank).
- tensorrt_llm/executor/request.py@4ce835a: LoRARequest (llmapi-1.2.md §3).
- TorchLlmArgs' fields: engine_build/upstream_llm_args.py (recorded once, for check-repo and the stand-in alike).
- triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt: NVIDIA's llmapi model's inputs and outputs (read at
  0a71057, later than 1.2.1: its image_url and lora_* inputs are left out, as they are not in c8c6df0 nor documented
  at r26.07; llmapi-1.2.md §6).
"""

REQUIRED = object()  # a parameter without a default

LLM_INIT = (("model", REQUIRED), ("tokenizer", None), ("tokenizer_mode", "auto"), ("skip_tokenizer_init", False),
            ("trust_remote_code", False), ("tensor_parallel_size", 1), ("dtype", "auto"), ("revision", None),
            ("tokenizer_revision", None), ("**kwargs", None))
GENERATE_ASYNC = (("inputs", REQUIRED), ("sampling_params", None), ("lora_request", None),
                  ("prompt_adapter_request", None), ("streaming", False), ("kv_cache_retention_config", None),
                  ("disaggregated_params", None), ("_postproc_params", None), ("scheduling_params", None),
                  ("cache_salt", None))
GET_STATS_ASYNC = (("timeout", 2),)
SHUTDOWN = ()
REQUEST_OUTPUT_ABORT = ()

SAMPLING_PARAMS = (
    ("end_id", None), ("pad_id", None), ("max_tokens", 32), ("bad", None), ("bad_token_ids", None), ("stop", None),
    ("stop_token_ids", None), ("include_stop_str_in_output", False), ("embedding_bias", None),
    ("logits_processor", None), ("apply_batched_logits_processor", False), ("n", 1), ("best_of", None),
    ("use_beam_search", False), ("top_k", None), ("top_p", None), ("top_p_min", None), ("top_p_reset_ids", None),
    ("top_p_decay", None), ("seed", None), ("temperature", None), ("min_tokens", None),
    ("beam_search_diversity_rate", None), ("repetition_penalty", None), ("presence_penalty", None),
    ("frequency_penalty", None), ("prompt_ignore_length", None), ("length_penalty", None), ("early_stopping", None),
    ("no_repeat_ngram_size", None), ("min_p", None), ("beam_width_array", None), ("logprobs", None),
    ("prompt_logprobs", None), ("return_context_logits", False), ("return_generation_logits", False),
    ("exclude_input_from_output", True), ("return_encoder_output", False), ("return_perf_metrics", False),
    ("additional_model_outputs", None), ("lookahead_config", None), ("guided_decoding", None), ("ignore_eos", False),
    ("detokenize", True), ("add_special_tokens", True), ("truncate_prompt_tokens", None),
    ("skip_special_tokens", True), ("spaces_between_special_tokens", True),
)
GUIDED_DECODING_PARAMS = (("json", None), ("regex", None), ("grammar", None), ("json_object", False),
                          ("structural_tag", None))
LORA_REQUEST = (("lora_name", REQUIRED), ("lora_int_id", REQUIRED), ("lora_path", ""), ("lora_ckpt_source", "hf"))
COMPLETION_OUTPUT = ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "prompt_logprobs",
                     "finish_reason", "stop_reason", "generation_logits", "disaggregated_params",
                     "request_perf_metrics")
COMPLETION_OUTPUT_DIFFS = ("length", "text_diff", "token_ids_diff", "logprobs_diff")
FINISH_REASONS = ("stop", "length", "timeout", "cancelled")

NGRAM_DECODING_CONFIG = ("max_draft_len", "max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")

# NVIDIA's llmapi model: (name, data_type) of its inputs and outputs.
LLMAPI_MODEL_INPUTS = {
    ("text_input", "TYPE_STRING"), ("streaming", "TYPE_BOOL"), ("sampling_param_best_of", "TYPE_INT32"),
    ("sampling_param_temperature", "TYPE_FP32"), ("sampling_param_top_k", "TYPE_INT32"),
    ("sampling_param_top_p", "TYPE_FP32"), ("sampling_param_frequency_penalty", "TYPE_FP32"),
    ("sampling_param_presence_penalty", "TYPE_FP32"), ("sampling_param_max_tokens", "TYPE_INT32"),
    ("sampling_param_stop", "TYPE_STRING"), ("sampling_param_seed", "TYPE_UINT64"),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL"), ("sampling_param_return_perf_metrics", "TYPE_BOOL"),
    ("return_finish_reason", "TYPE_BOOL"), ("return_stop_reason", "TYPE_BOOL"),
    ("return_cumulative_logprob", "TYPE_BOOL"), ("stop", "TYPE_BOOL"),
}
LLMAPI_MODEL_OUTPUTS = {
    ("text_output", "TYPE_STRING"), ("finish_reason", "TYPE_STRING"), ("stop_reason", "TYPE_STRING"),
    ("cumulative_logprob", "TYPE_FP32"), ("kv_cache_reused_block", "TYPE_INT32"),
    ("kv_cache_missed_block", "TYPE_INT32"), ("kv_cache_alloc_new_blocks", "TYPE_INT32"),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32"), ("kv_cache_hit_rate", "TYPE_FP32"),
    ("arrival_time_ns", "TYPE_INT64"), ("first_scheduled_time_ns", "TYPE_INT64"),
    ("first_token_time_ns", "TYPE_INT64"), ("last_token_time_ns", "TYPE_INT64"), ("acceptance_rate", "TYPE_FP32"),
    ("total_accepted_draft_tokens", "TYPE_INT32"), ("total_draft_tokens", "TYPE_INT32"),
}
