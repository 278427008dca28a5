"""model.yaml: the `LLM()` arguments of the repository's `tensorrt_llm`, NVIDIA's shape (LLM arguments at the top,
plus a `triton_config` section: triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml), read as NVIDIA's model
reads it (yaml.safe_load; `LLM_CONFIG_PATH` names another file in the version folder).

Paths in it (model, tokenizer, speculative_config.speculative_model_dir / speculative_model, lora_config.lora_dir)
are relative to the version folder, so that the repository can move; they are resolved here (an absolute path is
kept). NVIDIA's model hands the file to `update_llm_args_with_extra_dict({}, ...)`; so does this one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONFIG_FILE = "model.yaml"
CONFIG_PATH_ENV = "LLM_CONFIG_PATH"  # NVIDIA's model's variable
# NVIDIA's model's default period between checks of Triton's request cancellation.
DEFAULT_CANCELLATION_CHECK_PERIOD_MS = 100


class ModelConfigError(ValueError):
    pass


@dataclass(frozen=True)
class LoraAdapterPath:
    """One adapter of the repository: what the model builds the LLM API's LoRARequest(lora_name, lora_int_id,
    lora_path) from."""

    name: str
    task_id: int
    path: str  # the Hugging Face PEFT folder (resolved)


@dataclass(frozen=True)
class LlmModelConfig:
    llm_args: dict[str, Any]  # model.yaml without triton_config, paths resolved
    decoupled: bool
    cancellation_check_period_ms: int

    @property
    def tokenizer_dir(self) -> Path:
        return Path(self.llm_args.get("tokenizer") or self.llm_args["model"])

    def lora_adapters(self) -> dict[str, LoraAdapterPath]:
        """The repository's adapters by name: lora_config.lora_dir[i - 1] is task id i, its folder's name the
        adapter's (make repo LORA_DIR, engine_build/llmapi_flow.py lora_config; the same names and ids as
        preprocessing's lora_adapters table); none without lora_config."""
        folders = (self.llm_args.get("lora_config") or {}).get("lora_dir") or []
        adapters = {}
        for task_id, folder in enumerate(folders, start=1):
            name = Path(folder).name
            if name in adapters:
                raise ModelConfigError(f"model.yaml lora_config.lora_dir: two adapters named {name!r}")
            adapters[name] = LoraAdapterPath(name, task_id, str(folder))
        return adapters

    def max_seq_len(self) -> int:
        """Prompt plus output, at most: model.yaml's max_seq_len, else the checkpoint's max_position_embeddings
        (what the PyTorch flow and the stand-in take when it is unset)."""
        if self.llm_args.get("max_seq_len"):
            return int(self.llm_args["max_seq_len"])
        config = Path(self.llm_args["model"]) / "config.json"
        try:
            return int(json.loads(config.read_text())["max_position_embeddings"])
        except (OSError, ValueError, KeyError) as error:
            raise ModelConfigError(f"max_seq_len is unset in model.yaml and {config} does not say "
                                   f"max_position_embeddings ({error!r})") from None


def read_model_config(version_dir: Path) -> LlmModelConfig:
    path = version_dir / os.environ.get(CONFIG_PATH_ENV, DEFAULT_CONFIG_FILE)
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ModelConfigError(f"{path}: {error}") from None
    if not isinstance(config, dict) or "model" not in config:
        raise ModelConfigError(f"{path}: not a mapping of LLM() arguments with `model`")
    triton = config.pop("triton_config", None) or {}
    if "decoupled" not in triton:
        raise ModelConfigError(f"{path}: triton_config.decoupled is required (NVIDIA's model reads it)")
    return LlmModelConfig(
        llm_args=_resolve_paths(config, version_dir),
        decoupled=bool(triton["decoupled"]),
        cancellation_check_period_ms=int(triton.get("cancellation_check_period_ms",
                                                    DEFAULT_CANCELLATION_CHECK_PERIOD_MS)),
    )


def _resolve_paths(config: dict[str, Any], version_dir: Path) -> dict[str, Any]:
    def resolve(value: Any) -> Any:
        return value if value is None or Path(value).is_absolute() else str(version_dir / value)

    config = dict(config)
    for key in ("model", "tokenizer"):
        if key in config:
            config[key] = resolve(config[key])
    speculative = config.get("speculative_config")
    if isinstance(speculative, dict):
        config["speculative_config"] = {
            key: resolve(value) if key in ("speculative_model_dir", "speculative_model") else value
            for key, value in speculative.items()}
    lora = config.get("lora_config")
    if isinstance(lora, dict) and lora.get("lora_dir"):
        config["lora_config"] = {**lora, "lora_dir": [resolve(d) for d in lora["lora_dir"]]}
    return config
