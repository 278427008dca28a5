"""The tensor contract keeps NVIDIA's v0.14 names, dtypes and dims (upstream clients must work unchanged)."""

from bls.contract import CONTRACTS, ENSEMBLE, POSTPROCESSING, PREPROCESSING, TENSORRT_LLM, TENSORRT_LLM_BLS

# (name, data_type, dims) as declared by inflight_batcher_llm v0.14 (reference §1).
V014_ENGINE_INPUTS = {
    ("input_ids", "TYPE_INT32", (-1,)), ("input_lengths", "TYPE_INT32", (1,)),
    ("request_output_len", "TYPE_INT32", (1,)), ("draft_input_ids", "TYPE_INT32", (-1,)),
    ("end_id", "TYPE_INT32", (1,)), ("pad_id", "TYPE_INT32", (1,)),
    ("stop_words_list", "TYPE_INT32", (2, -1)), ("bad_words_list", "TYPE_INT32", (2, -1)),
    ("embedding_bias", "TYPE_FP32", (-1,)), ("beam_width", "TYPE_INT32", (1,)),
    ("temperature", "TYPE_FP32", (1,)), ("runtime_top_k", "TYPE_INT32", (1,)), ("runtime_top_p", "TYPE_FP32", (1,)),
    ("repetition_penalty", "TYPE_FP32", (1,)), ("min_length", "TYPE_INT32", (1,)),
    ("presence_penalty", "TYPE_FP32", (1,)), ("frequency_penalty", "TYPE_FP32", (1,)),
    ("random_seed", "TYPE_UINT64", (1,)), ("return_log_probs", "TYPE_BOOL", (1,)),
    ("return_context_logits", "TYPE_BOOL", (1,)), ("return_generation_logits", "TYPE_BOOL", (1,)),
    ("exclude_input_in_output", "TYPE_BOOL", (1,)), ("stop", "TYPE_BOOL", (1,)), ("streaming", "TYPE_BOOL", (1,)),
}
V014_ENGINE_OUTPUTS = {
    ("output_ids", "TYPE_INT32", (-1, -1)), ("sequence_length", "TYPE_INT32", (-1,)),
    ("cum_log_probs", "TYPE_FP32", (-1,)), ("output_log_probs", "TYPE_FP32", (-1, -1)),
    ("context_logits", "TYPE_FP32", (-1, -1)), ("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    ("batch_index", "TYPE_INT32", (1,)), ("sequence_index", "TYPE_INT32", (1,)),
}


def _triples(specs):
    return {(s.name, s.data_type, s.dims) for s in specs}


def test_engine_contract_is_v014():
    assert V014_ENGINE_INPUTS <= _triples(TENSORRT_LLM.inputs)
    assert V014_ENGINE_OUTPUTS <= _triples(TENSORRT_LLM.outputs)
    required = {s.name for s in TENSORRT_LLM.inputs if not s.optional}
    assert required == {"input_ids", "input_lengths", "request_output_len"}


def test_pre_and_postprocessing_names():
    assert {"QUERY", "REQUEST_OUTPUT_LEN", "BAD_WORDS_DICT", "STOP_WORDS_DICT", "END_ID", "PAD_ID"} <= {
        s.name for s in PREPROCESSING.inputs}
    assert PREPROCESSING.output("STOP_WORDS_IDS").dims == (2, -1)
    assert PREPROCESSING.output("INPUT_ID").data_type == "TYPE_INT32"
    assert _triples(POSTPROCESSING.inputs) == {("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
                                               ("SEQUENCE_LENGTH", "TYPE_INT32", (-1,))}


def test_extensions_are_optional_so_v014_clients_never_see_them():
    for contract in CONTRACTS.values():
        for spec in contract.inputs:
            if spec.extension:
                assert spec.optional, spec.name


def test_text_api_shared_by_ensemble_and_bls():
    assert _triples(ENSEMBLE.inputs) <= _triples(TENSORRT_LLM_BLS.inputs)
    assert ENSEMBLE.input("max_tokens").optional is False
    assert TENSORRT_LLM_BLS.output("text_output").dims == (-1,)
