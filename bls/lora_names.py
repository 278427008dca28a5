"""LoRA adapters by name: the repository's adapter table, and the task id a request's `lora_name` selects.

`make repo LORA_DIR=...` names each adapter by its folder and gives it a task id (engine_build/lora.py); the table
reaches the text models as their `lora_adapters` parameter, `name=task_id` pairs joined by commas (names are plain:
A-Z a-z 0-9 . _ -). preprocessing turns `lora_name` (and NVIDIA's `lora_task_id`, passed through) into the engine's
`lora_task_id`, for the ensemble and the BLS alike.
"""

from __future__ import annotations

import numpy as np

from bls.batch import BatchInputs
from bls.errors import InvalidRequest


def format_adapter_table(adapters: dict[str, int]) -> str:
    return ",".join(f"{name}={task_id}" for name, task_id in adapters.items())


def parse_adapter_table(text: str | None) -> dict[str, int]:
    """The `lora_adapters` parameter as {name: task id}; a malformed table fails the model's load, naming it."""
    table: dict[str, int] = {}
    for entry in filter(None, (text or "").split(",")):
        name, _, task_id = entry.partition("=")
        if not name or not task_id.isdigit() or name in table:
            raise ValueError(f"lora_adapters: {entry!r} is not a new name=task_id pair (in {text!r})")
        table[name] = int(task_id)
    return table


def lora_task_ids(rows: BatchInputs, table: dict[str, int], name_input: str, id_input: str) -> np.ndarray | None:
    """[batch, 1] uint64 engine task ids from the rows' adapter names (looked up in `table`) or task ids (passed
    through); None when the request names no adapter. A row giving both must agree."""
    if not rows.has(name_input) and not rows.has(id_input):
        return None
    task_ids = []
    for row in range(rows.batch_size):
        task_id = rows.scalar(id_input, row, int)
        if rows.has(name_input):
            name = rows.text(name_input, row)
            if name not in table:
                served = ", ".join(table) if table else "none: it was built without LORA_DIR"
                raise InvalidRequest("lora_name", f"unknown LoRA adapter {name!r} (this repository serves: {served})")
            if task_id is not None and task_id != table[name]:
                raise InvalidRequest("lora_task_id", f"{task_id} is not the task id of lora_name {name!r} "
                                                     f"({table[name]}); send one of them")
            task_id = table[name]
        task_ids.append(task_id)
    return np.array(task_ids, np.uint64).reshape(-1, 1)
