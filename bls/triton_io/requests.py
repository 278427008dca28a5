"""A request's inputs and parameters, a model's config parameters, and the shipped-files check at load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from bls.artifact import verify_model_files
from bls.contract import ModelContract
from bls.errors import InvalidRequest
from bls.relay.frames import RELAY_PARAMETERS

Tensors = dict[str, np.ndarray]


def read_inputs(request: Any, contract: ModelContract) -> Tensors:
    """All inputs present in `request`, as numpy arrays, with required ones enforced.

    Triton 2.51 stops enforcing required inputs as soon as any optional input is present, so the
    check is repeated here. Dtype and dims were already checked by Triton against the config.
    Request parameters are refused by name (see check_no_parameters).
    """
    check_no_parameters(request_parameters(request))
    tensors: Tensors = {}
    for spec in contract.inputs:
        tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
        if tensor is None:
            if not spec.optional:
                raise InvalidRequest(spec.name, "is required")
            continue
        tensors[spec.name] = tensor.as_numpy()
    return tensors


# Parameters Triton's own clients and frontends attach to requests; they configure Triton, not the model.
_TRITON_PARAMETERS = ("triton_", "sequence_", "priority", "timeout", "headers", "binary_data")
# Parameters that are not misspelt inputs: NVIDIA's inflight_batcher_llm_client.py (v0.14) sends {"Streaming":
# ...} beside the `streaming` input, which is what decides (the tensorrtllm backend ignores it too); the generate
# endpoint makes a body's "id" the request id and also passes it on as a parameter (http_server.cc, 2.49+); the
# relay (bls.relay.frames) says where a relayed request's responses go (it refuses those names from clients).
_NOT_INPUTS = frozenset({"Streaming", "id", *RELAY_PARAMETERS})


def check_shipped_files(version_dir: Path, model_name: str) -> None:
    """At load: the model's files are the ones `make repo` wrote (bls.artifact); logs what was checked."""
    pb_utils.Logger.log_info(f"{model_name}: {verify_model_files(version_dir)}")


def check_no_parameters(parameters: Mapping[str, Any]) -> None:
    """Refuse request parameters: these models take inputs only.

    Triton's `generate` endpoint turns every JSON field that is not an input of the model into a request
    parameter (and an ensemble forwards them to its steps), so a misspelt or unsupported field would
    otherwise be dropped without a word: `{"seed": 1}` sent to a model without a `seed` input.
    """
    for name in parameters:
        if not name.startswith(_TRITON_PARAMETERS) and name not in _NOT_INPUTS:
            raise InvalidRequest(name, "is not an input of this model (Triton's generate endpoint passes fields "
                                       "that are not inputs on as parameters, which these models do not use)")


def request_parameters(request: Any) -> dict[str, Any]:
    """The request's parameters as a dict (caller holds PB_LOCK)."""
    raw = request.parameters()
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
