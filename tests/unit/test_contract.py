"""Conformance: our contracts against NVIDIA's, recorded as data in upstream_contracts.py.

The engine must be exactly TensorRT-LLM 1.2.1's (the C++ backend ignores unknown names, so any drift is a
silent no-op on a GPU). The text models must take every input of both generations (v0.14 and 1.2) with
upstream's dtype and dims; where upstream requires an input and we do not (text_input / QUERY, which
`messages` may replace), the model checks it itself.
"""

from bls.contract import (
    CONTRACTS,
    ENSEMBLE,
    HANDOFF_TEXT_STATE,
    POSTPROCESSING,
    PREPROCESSING,
    TENSORRT_LLM,
    TENSORRT_LLM_BLS,
    TENSORRT_LLM_HANDOFF,
)
from tests.unit import upstream_contracts as upstream

# Required upstream, optional here: `messages` / MESSAGES may replace the first two; the models refuse a request
# without max_tokens / REQUEST_OUTPUT_LEN themselves, which Triton's ensemble needs to report it (bls/contract.py).
OPTIONAL_HERE = {"text_input", "QUERY", "max_tokens", "REQUEST_OUTPUT_LEN"}


def _inputs(specs):
    return {(s.name, s.data_type, s.dims, s.optional or False) for s in specs}


def _outputs(specs):
    return {(s.name, s.data_type, s.dims) for s in specs}


def _relaxed(entries):
    """Upstream input entries with the inputs we make optional marked optional."""
    return {(n, t, d, o or n in OPTIONAL_HERE) for n, t, d, o in entries}


def test_engine_contract_is_exactly_1_2_1():
    ours = {(s.name, s.data_type, s.dims, s.optional, s.reshape_scalar, s.allow_ragged_batch)
            for s in TENSORRT_LLM.inputs}
    assert ours == upstream.V121_ENGINE_INPUTS
    assert _outputs(TENSORRT_LLM.outputs) == upstream.V121_ENGINE_OUTPUTS
    assert not any(s.extension for s in TENSORRT_LLM.inputs + TENSORRT_LLM.outputs)


def test_text_api_takes_every_input_of_both_generations():
    for contract, extra_121, extra_014 in (
        (ENSEMBLE, set(), set()),
        (TENSORRT_LLM_BLS, upstream.V121_BLS_EXTRA_INPUTS, upstream.V014_BLS_EXTRA_INPUTS),
    ):
        ours = _inputs(contract.inputs)
        assert _relaxed(upstream.V121_TEXT_INPUTS | extra_121) <= ours
        assert _relaxed(upstream.V014_TEXT_INPUTS | extra_014) <= ours
        assert _outputs(contract.outputs) >= upstream.V121_TEXT_OUTPUTS | upstream.V014_TEXT_OUTPUTS
        # Everything beyond upstream's is ours, optional, and marked as an extension.
        upstream_names = {e[0] for e in upstream.V121_TEXT_INPUTS | upstream.V014_TEXT_INPUTS | extra_121 | extra_014}
        for spec in contract.inputs:
            if spec.name not in upstream_names:
                assert spec.extension and spec.optional, spec.name


def test_pre_and_postprocessing_keep_upstream_names():
    assert _relaxed(upstream.V014_PREPROCESSING_INPUTS) <= _inputs(PREPROCESSING.inputs)
    assert upstream.V014_PREPROCESSING_OUTPUTS <= _outputs(PREPROCESSING.outputs)
    inputs, outputs = upstream.V014_POSTPROCESSING
    ours = {spec for spec in POSTPROCESSING.inputs if not spec.extension}
    assert _inputs(ours) == inputs and _outputs(POSTPROCESSING.outputs) == outputs
    # Ours: the stream state for exact streamed text (bls/text/postprocessing.py), optional.
    assert {s.name for s in POSTPROCESSING.inputs if s.extension} == {"PRECEDING_IDS"}


def test_the_handoff_is_the_engine_plus_its_own_optional_outputs():
    """The handoff's inputs and the engine's outputs are the engine's, exactly; its stream state is ours, one tensor
    (each the ensemble carries costs CPU at every streamed token), sent only to a request that asks for it (the
    ensemble), and postprocessing's optional input of the same type and shape."""
    assert TENSORRT_LLM_HANDOFF.inputs == TENSORRT_LLM.inputs
    assert TENSORRT_LLM_HANDOFF.outputs[: len(TENSORRT_LLM.outputs)] == TENSORRT_LLM.outputs
    extra = TENSORRT_LLM_HANDOFF.outputs[len(TENSORRT_LLM.outputs):]
    assert HANDOFF_TEXT_STATE == {"preceding_ids": "PRECEDING_IDS"}
    assert [(s.name, s.data_type, s.dims, s.extension) for s in extra] == [
        ("preceding_ids", "TYPE_INT32", (-1, -1), True)]
    post = POSTPROCESSING.input("PRECEDING_IDS")
    assert (post.data_type, post.dims, post.optional, post.extension) == ("TYPE_INT32", (-1, -1), True, True)


def test_extensions_are_optional_so_upstream_clients_never_see_them():
    for contract in CONTRACTS.values():
        for spec in contract.inputs:
            if spec.extension:
                assert spec.optional, spec.name
