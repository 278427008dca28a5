"""The models this API serves, by the id a request's `model` names: the base model, and the repository's LoRA
adapters by name.

An adapter's id is its name in the repository (`make repo LORA_DIR=...` names each by its folder and records it in
repository.json's `lora_adapters`); a request naming one sends the BLS `lora_name`, which preprocessing turns into the
engine's task id (bls/lora_names.py). The base model's id selects no adapter. /v1/models lists them as vLLM does:
OpenAI's Model object, with an adapter's `parent` the base model's id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bls.artifact import MANIFEST
from openai_api.errors import ApiError
from openai_api.triton import text

OWNER = "llama3-triton"


@dataclass(frozen=True)
class ServedModels:
    base: str  # the base model's id
    adapters: tuple[str, ...] = ()  # the repository's LoRA adapters, by name
    created: int = 0  # the Model objects' `created`

    def __post_init__(self):
        if self.base in self.adapters:
            raise ValueError(f"the model name {self.base!r} is also a LoRA adapter's name in the repository: a request "
                             "naming it could not say which it means; start with another --model-name")

    def bls_inputs(self, model: str) -> dict[str, np.ndarray]:
        """The BLS inputs that select what a request's `model` names: `lora_name` for an adapter, none for the base
        model; an id this server does not serve is a 404 naming it."""
        if model == self.base:
            return {}
        if model in self.adapters:
            return {"lora_name": text(model)}
        served = ", ".join(repr(name) for name in (self.base, *self.adapters))
        raise ApiError(404, f"model {model!r} does not exist; this server serves {served}", param="model",
                       code="model_not_found")

    def card(self, model: str) -> dict:
        """The Model object of a served id (a 404 for any other)."""
        self.bls_inputs(model)
        return {"id": model, "object": "model", "created": self.created, "owned_by": OWNER,
                "parent": None if model == self.base else self.base}

    def cards(self) -> list[dict]:
        return [self.card(model) for model in (self.base, *self.adapters)]


def repository_manifest(repo: Path | None) -> dict:
    """The served repository's repository.json ({} without --repo or without one, e.g. a hand-made repository)."""
    if repo is None or not (repo / MANIFEST).is_file():
        return {}
    return json.loads((repo / MANIFEST).read_text())


def base_model_name(manifest: dict) -> str:
    """The served checkpoint's directory name: repository.json's tokenizer_dir (a real model's Hugging Face
    checkpoint, e.g. Meta-Llama-3-8B-Instruct), or for the default assets (build/assets/tokenizer, generated) the
    embedded engine's checkpoint (tiny-target-awq); "llama3" without a repository."""
    tokenizer = Path(manifest.get("tokenizer_dir") or "")
    if tokenizer.parent.name == "assets" and manifest.get("target"):
        return Path(manifest["target"]).name
    return tokenizer.name or "llama3"


def adapter_names(manifest: dict) -> tuple[str, ...]:
    """The repository's LoRA adapters (repository.json's `lora_adapters`, engine_build/lora.py), by name."""
    return tuple(adapter["name"] for adapter in manifest.get("lora_adapters") or [])
