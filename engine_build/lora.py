"""`make repo LORA_DIR=<dir>`: Hugging Face PEFT LoRA adapters -> TensorRT-LLM 1.2.1's LoRA format, placed for the
backend's `lora_prefetch_dir`, and the engine's LoRA build options derived from them.

Each subfolder of LORA_DIR is one PEFT adapter (adapter_config.json + adapter_model.safetensors or .bin) of the base
model, named by its folder; embedded_engine/peft_lora.py reads and converts it (hf_lora_convert.py, made strict).
Files: `<prefetch dir>/<task id>/model.lora_weights.npy` [1, N, W] and `model.lora_config.npy` [1, N, 3].
Task ids are 1, 2, ... in the order of the adapters' names (0 is "no LoRA" to NVIDIA's client, which then sends no
lora_task_id at all).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bls.lora_names import format_adapter_table
from embedded_engine.lora import (
    DEFAULT_LORA_CACHE_BYTES,
    DEFAULT_MAX_LORA_RANK,
    MODULE_NAMES,
    MODULES_BY_NAME,
    PREFETCH_CONFIG,
    PREFETCH_WEIGHTS,
    LoraLayout,
    read_prefetch_adapter,
)
from embedded_engine.peft_lora import (
    AdapterError,
    ConvertedAdapter,
    adapter_dirs,
    adapter_modules,
    convert_peft_adapter,
)

# The prefetch folder inside the engine model's version folder (tensorrt_llm/1/).
PREFETCH_DIR = "lora"


def convert_lora_dir(lora_dir: Path, base_config, max_rank: int = DEFAULT_MAX_LORA_RANK) -> list[ConvertedAdapter]:
    """Every adapter of LORA_DIR converted for the base (a transformers LlamaConfig), task ids 1, 2, ...; the engine's
    modules are the adapters' own, completed (complete_modules)."""
    modules, largest = adapter_modules(lora_dir)
    layout = LoraLayout.from_config(base_config, modules, max_rank)
    return [convert_peft_adapter(path, task_id, layout)
            for task_id, path in enumerate(adapter_dirs(lora_dir), start=1)]


def adapter_record(adapter: ConvertedAdapter) -> dict:
    """The adapter's entry in repository.json (relative paths: the repository is relocatable)."""
    return {"name": adapter.name, "task_id": adapter.task_id, "rank": adapter.rank, "lora_alpha": adapter.alpha,
            "use_rslora": adapter.use_rslora, "target_modules": list(adapter.modules),
            "base_model_name_or_path": adapter.base_model, "prefetch": f"{PREFETCH_DIR}/{adapter.task_id}"}


def write_prefetch_dir(adapters: list[ConvertedAdapter], dest: Path) -> None:
    """`dest/<task id>/model.lora_weights.npy` + `model.lora_config.npy`, as the backend's lora_prefetch_dir reads."""
    for adapter in adapters:
        folder = Path(dest) / str(adapter.task_id)
        folder.mkdir(parents=True)
        np.save(folder / PREFETCH_WEIGHTS, adapter.weights, allow_pickle=False)
        np.save(folder / PREFETCH_CONFIG, adapter.config, allow_pickle=False)


def adapter_table(adapters: list[ConvertedAdapter]) -> str:
    """The lora_adapters parameter preprocessing looks names up in (bls.lora_names)."""
    return format_adapter_table({adapter.name: adapter.task_id for adapter in adapters})


def lora_cache_bytes(adapters: list[ConvertedAdapter], bytes_per_value: int) -> int:
    """A LoRA host cache that holds every prefetched adapter twice over (room for as many sent with requests), and
    never less than the backend's default (1 GB)."""
    values = sum(adapter.weights.size for adapter in adapters)
    return max(DEFAULT_LORA_CACHE_BYTES, 2 * values * bytes_per_value)


def base_llama_config(checkpoint: Path):
    """The LlamaConfig adapters are checked against: an HF checkpoint's, a TensorRT-LLM checkpoint's or a built
    engine's (its pretrained_config)."""
    from transformers import LlamaConfig

    from embedded_engine.checkpoint import CheckpointError, is_trtllm_config, llama_config_from_trtllm

    config_file = Path(checkpoint) / "config.json"
    if not config_file.is_file():
        raise AdapterError(f"the base {checkpoint} has no config.json to check the adapters against")
    raw = json.loads(config_file.read_text())
    raw = raw.get("pretrained_config", raw)
    try:
        if is_trtllm_config(raw):
            return llama_config_from_trtllm(raw)
    except CheckpointError as error:
        raise AdapterError(f"the base {checkpoint}: {error}") from None
    if raw.get("architectures") != ["LlamaForCausalLM"]:
        raise AdapterError(f"the base {checkpoint} is {raw.get('architectures')}, not LlamaForCausalLM: LoRA here is "
                           "for Llama")
    return LlamaConfig.from_pretrained(str(checkpoint))


def name_table_problems(manifest: dict, adapter_table_text: str | None) -> list[str]:
    """preprocessing's adapter names (lora_adapters) against the adapters repository.json records, task ids unique."""
    from bls.lora_names import parse_adapter_table

    try:
        table = parse_adapter_table(adapter_table_text)
    except ValueError as error:
        return [f"preprocessing: {error}"]
    recorded = {adapter["name"]: adapter["task_id"] for adapter in manifest.get("lora_adapters") or []}
    problems = []
    if table != recorded:
        problems.append(f"preprocessing's lora_adapters {table} differ from {recorded} in repository.json: names would "
                        "select other adapters")
    if len(set(recorded.values())) != len(recorded):
        problems.append(f"two adapters share a task id: {recorded}")
    return problems


def repository_problems(manifest: dict, engine_backend: str, engine_params: dict[str, str],
                        served_prefetch_dir, adapter_table_text: str | None) -> list[str]:
    """What `make check-repo` finds wrong with a repository's LoRA adapters (engine_build/check_repo.py reports each
    against tensorrt_llm): the adapters repository.json records against preprocessing's name table, the prefetch
    folder the engine's config names and the files in it, as the backend loads them at start-up (a file that does not
    load fails the engine's load).

    `served_prefetch_dir(value)`: this repository's copy of the folder a lora_prefetch_dir value names (absolute for the
    C++ backend, relative to the version folder for the embedded engine)."""
    adapters = manifest.get("lora_adapters") or []
    problems = name_table_problems(manifest, adapter_table_text)
    prefetch_value = engine_params.get("lora_prefetch_dir", "")
    if not adapters:
        return problems
    if not prefetch_value or prefetch_value.startswith("${"):
        return problems + ["lora_prefetch_dir is unset: the adapters repository.json lists are never loaded, and a "
                           "request naming one fails ('not found in cache')"]
    folder = served_prefetch_dir(prefetch_value)
    max_rank = int(manifest.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK)
    built = set(filter(None, engine_params.get("lora_target_modules", "").split(","))) \
        if engine_backend == "python" else None
    for adapter in adapters:
        name, task_id = adapter["name"], adapter["task_id"]
        where = f"adapter {name!r} (task {task_id}) in {prefetch_value}/{task_id}"
        try:
            weights, config = read_prefetch_adapter(folder / str(task_id))
        except (OSError, ValueError) as error:
            problems.append(f"{where}: {error}")
            continue
        if weights.dtype != np.float16 or weights.ndim != 3 or weights.shape[0] != 1:
            problems.append(f"{where}: {PREFETCH_WEIGHTS} is {weights.dtype} {list(weights.shape)}; the engine takes "
                            "float16 [1, rows, values] (Triton's TYPE_FP16 lora_weights)")
            continue
        if config.dtype != np.int32 or config.ndim != 3 or config.shape[:2] != (1, weights.shape[1]) \
                or config.shape[2] != 3:
            problems.append(f"{where}: {PREFETCH_CONFIG} is {config.dtype} {list(config.shape)}; it must be int32 "
                            f"[1, {weights.shape[1]}, 3] (module_id, layer, rank per weights row)")
            continue
        ranks = set(config[0, :, 2].tolist())
        if ranks != {adapter["rank"]}:
            problems.append(f"{where}: ranks {sorted(ranks)} in its files, {adapter['rank']} in repository.json")
        if max(ranks) > max_rank:
            problems.append(f"{where}: rank {max(ranks)} is above the engine's max_lora_rank {max_rank}")
        modules = {MODULE_NAMES.get(module_id, str(module_id)) for module_id in config[0, :, 0].tolist()}
        unknown = sorted(modules - set(MODULES_BY_NAME))
        if unknown:
            problems.append(f"{where}: modules {unknown} are not Llama projections")
        if built is not None and modules - built:
            problems.append(f"{where}: modules {sorted(modules - built)} are not in the engine's lora_target_modules "
                            f"{sorted(built)}")
    return problems
