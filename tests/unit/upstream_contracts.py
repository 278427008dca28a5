"""NVIDIA's tensor contracts, recorded as data (no network at test time) for the conformance tests.

Each entry: (name, data_type, dims, optional) for inputs, (name, data_type, dims) for outputs, dims without
the batch dimension, `${...}` dtypes as upstream's defaults fill them for a text model (logits FP32,
prompt tables and encoder features FP16).

Sources (read 2026-11-22):
- v0.14: triton-inference-server/tensorrtllm_backend tag v0.14.0, all_models/inflight_batcher_llm/*/config.pbtxt.
- 1.2.1: NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/{tensorrt_llm,ensemble,
  tensorrt_llm_bls}/config.pbtxt of the 1.2 line (the 26.07 container's backend), and tensorrtllm_backend
  r26.07 docs/model_config.md.
"""

REQ, OPT = False, True  # required, optional

V014_TEXT_INPUTS = {  # ensemble (the BLS adds num_draft_tokens, use_draft_logits, image_input)
    ("text_input", "TYPE_STRING", (1,), REQ), ("decoder_text_input", "TYPE_STRING", (1,), OPT),
    ("max_tokens", "TYPE_INT32", (1,), REQ), ("num_return_sequences", "TYPE_INT32", (1,), OPT),
    ("bad_words", "TYPE_STRING", (-1,), OPT), ("stop_words", "TYPE_STRING", (-1,), OPT),
    ("end_id", "TYPE_INT32", (1,), OPT), ("pad_id", "TYPE_INT32", (1,), OPT), ("top_k", "TYPE_INT32", (1,), OPT),
    ("top_p", "TYPE_FP32", (1,), OPT),
    ("temperature", "TYPE_FP32", (1,), OPT), ("length_penalty", "TYPE_FP32", (1,), OPT),
    ("repetition_penalty", "TYPE_FP32", (1,), OPT), ("min_length", "TYPE_INT32", (1,), OPT),
    ("presence_penalty", "TYPE_FP32", (1,), OPT), ("frequency_penalty", "TYPE_FP32", (1,), OPT),
    ("random_seed", "TYPE_UINT64", (1,), OPT), ("return_log_probs", "TYPE_BOOL", (1,), OPT),
    ("return_context_logits", "TYPE_BOOL", (1,), OPT), ("return_generation_logits", "TYPE_BOOL", (1,), OPT),
    ("beam_width", "TYPE_INT32", (1,), OPT), ("stream", "TYPE_BOOL", (1,), OPT),
    ("prompt_embedding_table", "TYPE_FP16", (-1, -1), OPT), ("prompt_table_extra_id", "TYPE_UINT64", (1,), OPT),
    ("prompt_vocab_size", "TYPE_INT32", (1,), OPT), ("embedding_bias_words", "TYPE_STRING", (-1,), OPT),
    ("embedding_bias_weights", "TYPE_FP32", (-1,), OPT),
}
V014_BLS_EXTRA_INPUTS = {
    ("num_draft_tokens", "TYPE_INT32", (1,), OPT), ("use_draft_logits", "TYPE_BOOL", (1,), OPT),
    # v0.14 declares image_input as [3, -1, -1]; 1.2 as [-1, 3, -1, -1]. We pin 1.2 (and refuse images).
}
V014_TEXT_OUTPUTS = {
    ("text_output", "TYPE_STRING", (-1,)), ("cum_log_probs", "TYPE_FP32", (-1,)),
    ("output_log_probs", "TYPE_FP32", (-1, -1)), ("context_logits", "TYPE_FP32", (-1, -1)),
    ("generation_logits", "TYPE_FP32", (-1, -1, -1)), ("batch_index", "TYPE_INT32", (1,)),
    ("sequence_index", "TYPE_INT32", (1,)),
}
V014_PREPROCESSING_INPUTS = {
    ("QUERY", "TYPE_STRING", (1,), REQ), ("DECODER_QUERY", "TYPE_STRING", (1,), OPT),
    ("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,), REQ), ("BAD_WORDS_DICT", "TYPE_STRING", (-1,), OPT),
    ("STOP_WORDS_DICT", "TYPE_STRING", (-1,), OPT), ("EMBEDDING_BIAS_WORDS", "TYPE_STRING", (-1,), OPT),
    ("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", (-1,), OPT), ("END_ID", "TYPE_INT32", (1,), OPT),
    ("PAD_ID", "TYPE_INT32", (1,), OPT), ("PROMPT_TABLE_EXTRA_ID", "TYPE_UINT64", (1,), OPT),
}
V014_PREPROCESSING_OUTPUTS = {
    ("INPUT_ID", "TYPE_INT32", (-1,)), ("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    ("DECODER_INPUT_ID", "TYPE_INT32", (-1,)), ("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32", (1,)),
    ("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)), ("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    ("EMBEDDING_BIAS", "TYPE_FP32", (-1,)), ("REQUEST_OUTPUT_LEN", "TYPE_INT32", (-1,)),
    ("OUT_END_ID", "TYPE_INT32", (1,)), ("OUT_PAD_ID", "TYPE_INT32", (1,)),
    ("OUT_PROMPT_TABLE_EXTRA_IDS", "TYPE_UINT64", (-1,)),
}
V014_POSTPROCESSING = (
    {("TOKENS_BATCH", "TYPE_INT32", (-1, -1), REQ), ("SEQUENCE_LENGTH", "TYPE_INT32", (-1,), REQ)},
    {("OUTPUT", "TYPE_STRING", (-1,))},
)

# tensorrt_llm 1.2.1: (name, data_type, dims, optional, reshape to scalar, allow_ragged_batch)
R, N = True, False
V121_ENGINE_INPUTS = {
    ("input_ids", "TYPE_INT32", (-1,), OPT, N, R), ("encoder_input_features", "TYPE_FP16", (-1, -1), OPT, N, R),
    ("encoder_output_lengths", "TYPE_INT32", (1,), OPT, R, N), ("input_lengths", "TYPE_INT32", (1,), REQ, R, N),
    ("request_output_len", "TYPE_INT32", (1,), REQ, R, N), ("num_return_sequences", "TYPE_INT32", (1,), OPT, R, N),
    ("draft_input_ids", "TYPE_INT32", (-1,), OPT, N, R), ("decoder_input_ids", "TYPE_INT32", (-1,), OPT, N, R),
    ("decoder_input_lengths", "TYPE_INT32", (1,), OPT, R, N), ("draft_logits", "TYPE_FP32", (-1, -1), OPT, N, R),
    ("draft_acceptance_threshold", "TYPE_FP32", (1,), OPT, R, N), ("end_id", "TYPE_INT32", (1,), OPT, R, N),
    ("pad_id", "TYPE_INT32", (1,), OPT, R, N), ("stop_words_list", "TYPE_INT32", (2, -1), OPT, N, R),
    ("bad_words_list", "TYPE_INT32", (2, -1), OPT, N, R), ("embedding_bias", "TYPE_FP32", (-1,), OPT, N, R),
    ("beam_width", "TYPE_INT32", (1,), OPT, R, N), ("temperature", "TYPE_FP32", (1,), OPT, R, N),
    ("runtime_top_k", "TYPE_INT32", (1,), OPT, R, N), ("runtime_top_p", "TYPE_FP32", (1,), OPT, R, N),
    ("runtime_top_p_min", "TYPE_FP32", (1,), OPT, R, N), ("runtime_top_p_decay", "TYPE_FP32", (1,), OPT, R, N),
    ("runtime_top_p_reset_ids", "TYPE_INT32", (1,), OPT, R, N), ("len_penalty", "TYPE_FP32", (1,), OPT, R, N),
    ("early_stopping", "TYPE_BOOL", (1,), OPT, R, N), ("repetition_penalty", "TYPE_FP32", (1,), OPT, R, N),
    ("min_tokens", "TYPE_INT32", (1,), OPT, R, N), ("beam_search_diversity_rate", "TYPE_FP32", (1,), OPT, R, N),
    ("presence_penalty", "TYPE_FP32", (1,), OPT, R, N), ("frequency_penalty", "TYPE_FP32", (1,), OPT, R, N),
    ("seed", "TYPE_UINT64", (1,), OPT, R, N), ("return_log_probs", "TYPE_BOOL", (1,), OPT, R, N),
    ("return_context_logits", "TYPE_BOOL", (1,), OPT, R, N), ("return_generation_logits", "TYPE_BOOL", (1,), OPT, R, N),
    ("return_perf_metrics", "TYPE_BOOL", (1,), OPT, R, N), ("return_num_input_tokens", "TYPE_BOOL", (1,), OPT, R, N),
    ("return_num_output_tokens", "TYPE_BOOL", (1,), OPT, R, N),
    ("exclude_input_in_output", "TYPE_BOOL", (1,), OPT, R, N),
    ("stop", "TYPE_BOOL", (1,), OPT, R, N), ("streaming", "TYPE_BOOL", (1,), OPT, R, N),
    ("prompt_embedding_table", "TYPE_FP16", (-1, -1), OPT, N, R),
    ("prompt_table_extra_ids", "TYPE_UINT64", (-1,), OPT, N, R),
    ("prompt_vocab_size", "TYPE_INT32", (1,), OPT, R, N), ("cross_attention_mask", "TYPE_BOOL", (-1, -1), OPT, N, R),
    ("mrope_rotary_cos_sin", "TYPE_FP32", (-1,), OPT, N, N), ("mrope_position_deltas", "TYPE_INT64", (1,), OPT, N, N),
    ("lora_task_id", "TYPE_UINT64", (1,), OPT, R, N), ("lora_weights", "TYPE_FP16", (-1, -1), OPT, N, R),
    ("lora_config", "TYPE_INT32", (-1, 3), OPT, N, R), ("context_phase_params", "TYPE_UINT8", (-1,), OPT, N, R),
    ("skip_cross_attn_blocks", "TYPE_BOOL", (1,), OPT, N, R),
    ("retention_token_range_starts", "TYPE_INT32", (-1,), OPT, N, R),
    ("retention_token_range_ends", "TYPE_INT32", (-1,), OPT, N, R),
    ("retention_token_range_priorities", "TYPE_INT32", (-1,), OPT, N, R),
    ("retention_token_range_durations_ms", "TYPE_INT32", (-1,), OPT, N, R),
    ("retention_decode_priority", "TYPE_INT32", (1,), OPT, N, R),
    ("retention_decode_duration_ms", "TYPE_INT32", (1,), OPT, N, R),
    ("guided_decoding_guide_type", "TYPE_STRING", (1,), OPT, N, R),
    ("guided_decoding_guide", "TYPE_STRING", (1,), OPT, N, R),
    ("lookahead_window_size", "TYPE_INT32", (1,), OPT, N, R), ("lookahead_ngram_size", "TYPE_INT32", (1,), OPT, N, R),
    ("lookahead_verification_set_size", "TYPE_INT32", (1,), OPT, N, R),
}
V121_DETAIL_OUTPUTS = {  # what the engine, the ensemble and the BLS return besides tokens / text
    ("cum_log_probs", "TYPE_FP32", (-1,)), ("output_log_probs", "TYPE_FP32", (-1, -1)),
    ("context_logits", "TYPE_FP32", (-1, -1)), ("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    ("batch_index", "TYPE_INT32", (1,)), ("sequence_index", "TYPE_INT32", (1,)),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)), ("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)), ("arrival_time_ns", "TYPE_INT64", (1,)),
    ("first_scheduled_time_ns", "TYPE_INT64", (1,)), ("first_token_time_ns", "TYPE_INT64", (1,)),
    ("last_token_time_ns", "TYPE_INT64", (1,)), ("acceptance_rate", "TYPE_FP32", (1,)),
    ("total_accepted_draft_tokens", "TYPE_INT32", (1,)), ("total_draft_tokens", "TYPE_INT32", (1,)),
    ("num_input_tokens", "TYPE_INT32", (1,)), ("num_output_tokens", "TYPE_INT32", (1,)),
}
V121_ENGINE_OUTPUTS = V121_DETAIL_OUTPUTS | {
    ("output_ids", "TYPE_INT32", (-1, -1)), ("sequence_length", "TYPE_INT32", (-1,)),
    ("context_phase_params", "TYPE_UINT8", (-1,)),
}
V121_TEXT_INPUTS = {  # ensemble 1.2 (the BLS: the same plus V121_BLS_EXTRA_INPUTS)
    ("text_input", "TYPE_STRING", (1,), REQ), ("decoder_text_input", "TYPE_STRING", (1,), OPT),
    ("max_tokens", "TYPE_INT32", (1,), REQ), ("num_return_sequences", "TYPE_INT32", (1,), OPT),
    ("bad_words", "TYPE_STRING", (-1,), OPT), ("stop_words", "TYPE_STRING", (-1,), OPT),
    ("exclude_input_in_output", "TYPE_BOOL", (1,), OPT), ("end_id", "TYPE_INT32", (1,), OPT),
    ("pad_id", "TYPE_INT32", (1,), OPT), ("top_k", "TYPE_INT32", (1,), OPT), ("top_p", "TYPE_FP32", (1,), OPT),
    ("temperature", "TYPE_FP32", (1,), OPT), ("length_penalty", "TYPE_FP32", (1,), OPT),
    ("repetition_penalty", "TYPE_FP32", (1,), OPT), ("min_tokens", "TYPE_INT32", (1,), OPT),
    ("presence_penalty", "TYPE_FP32", (1,), OPT), ("frequency_penalty", "TYPE_FP32", (1,), OPT),
    ("seed", "TYPE_UINT64", (1,), OPT), ("return_log_probs", "TYPE_BOOL", (1,), OPT),
    ("return_context_logits", "TYPE_BOOL", (1,), OPT), ("return_generation_logits", "TYPE_BOOL", (1,), OPT),
    ("return_perf_metrics", "TYPE_BOOL", (1,), OPT), ("return_num_input_tokens", "TYPE_BOOL", (1,), OPT),
    ("return_num_output_tokens", "TYPE_BOOL", (1,), OPT), ("beam_width", "TYPE_INT32", (1,), OPT),
    ("stream", "TYPE_BOOL", (1,), OPT), ("prompt_embedding_table", "TYPE_FP16", (-1, -1), OPT),
    ("prompt_table_extra_id", "TYPE_UINT64", (1,), OPT), ("prompt_vocab_size", "TYPE_INT32", (1,), OPT),
    ("embedding_bias_words", "TYPE_STRING", (-1,), OPT), ("embedding_bias_weights", "TYPE_FP32", (-1,), OPT),
    ("lora_task_id", "TYPE_UINT64", (1,), OPT), ("lora_weights", "TYPE_FP16", (-1, -1), OPT),
    ("lora_config", "TYPE_INT32", (-1, 3), OPT), ("guided_decoding_guide_type", "TYPE_STRING", (1,), OPT),
    ("guided_decoding_guide", "TYPE_STRING", (1,), OPT),
}
V121_BLS_EXTRA_INPUTS = {
    ("image_input", "TYPE_FP16", (-1, 3, -1, -1), OPT), ("image_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), OPT),
    ("image_url_input", "TYPE_STRING", (1,), OPT), ("video_bytes_input", "TYPE_UINT8", (-1, -1, -1, -1), OPT),
    ("num_draft_tokens", "TYPE_INT32", (1,), OPT), ("use_draft_logits", "TYPE_BOOL", (1,), OPT),
}
V121_TEXT_OUTPUTS = V121_DETAIL_OUTPUTS | {("text_output", "TYPE_STRING", (-1,))}
