"""lora_name -> the engine's lora_task_id (bls/lora_names.py), as preprocessing does it for the ensemble and the BLS."""

from __future__ import annotations

import numpy as np
import pytest

from bls.batch import BatchInputs
from bls.errors import InvalidRequest
from bls.lora_names import format_adapter_table, lora_task_ids, parse_adapter_table

TABLE = {"alpha": 1, "beta.v2": 2}


def task_ids(inputs: dict, batch: int = 1):
    return lora_task_ids(BatchInputs(inputs, batch), TABLE, "LORA_NAME", "LORA_TASK_ID")


def test_the_table_round_trips_and_a_malformed_one_fails_the_load_naming_it():
    assert parse_adapter_table(format_adapter_table(TABLE)) == TABLE
    assert parse_adapter_table("") == {} and parse_adapter_table(None) == {}
    for text in ("alpha", "alpha=x", "=1", "alpha=1,alpha=2"):
        with pytest.raises(ValueError, match="lora_adapters"):
            parse_adapter_table(text)


def test_names_become_task_ids_row_by_row_and_task_ids_pass_through():
    names = np.array([[b"beta.v2"], [b"alpha"]], dtype=object)
    assert task_ids({"LORA_NAME": names}, 2).tolist() == [[2], [1]]
    assert task_ids({"LORA_TASK_ID": np.array([[7]], np.uint64)}).tolist() == [[7]]
    assert task_ids({"LORA_NAME": np.array([[b"alpha"]], object), "LORA_TASK_ID": np.array([[1]], np.uint64)}) \
        .tolist() == [[1]]
    assert task_ids({}) is None  # no adapter: the engine runs the base model
    assert task_ids({"LORA_NAME": names}, 2).dtype == np.uint64


def test_unknown_names_and_disagreeing_ids_are_refused_naming_them():
    with pytest.raises(InvalidRequest, match="lora_name: unknown LoRA adapter 'gamma' \\(this repository serves: "
                                             "alpha, beta.v2\\)"):
        task_ids({"LORA_NAME": np.array([[b"gamma"]], object)})
    with pytest.raises(InvalidRequest, match="lora_task_id: 2 is not the task id of lora_name 'alpha' \\(1\\)"):
        task_ids({"LORA_NAME": np.array([[b"alpha"]], object), "LORA_TASK_ID": np.array([[2]], np.uint64)})
    with pytest.raises(InvalidRequest, match="none: it was built without LORA_DIR"):
        lora_task_ids(BatchInputs({"LORA_NAME": np.array([[b"alpha"]], object)}, 1), {}, "LORA_NAME", "LORA_TASK_ID")


def test_preprocessing_sends_the_engine_the_task_id_only_when_an_adapter_is_named(bundle):
    from bls.text.preprocessing import Preprocessor

    preprocess = Preprocessor(bundle, lora_adapters=TABLE)
    request = {"QUERY": np.array([[b"Hi"]], object), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)}
    assert "OUT_LORA_TASK_ID" not in preprocess(request)
    named = preprocess({**request, "LORA_NAME": np.array([[b"beta.v2"]], object)})
    assert named["OUT_LORA_TASK_ID"].tolist() == [[2]] and named["OUT_LORA_TASK_ID"].dtype == np.uint64
