"""A model's config.pbtxt `parameters`, read as the models read them: plain functions, importable without Triton (so
that `make check-repo` reads a parameter exactly as the model will)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def model_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """config.pbtxt `parameters` as a plain dict; unfilled `${...}` placeholders count as unset."""
    params = {}
    for key, value in model_config.get("parameters", {}).items():
        text = value.get("string_value", "")
        if text and not text.startswith("${"):
            params[key] = text
    return params


def parse_bool(value: str | None, default: bool, name: str) -> bool:
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in {"true", "1", "yes", "y", "t", "on"}:
        return True
    if lowered in {"false", "0", "no", "n", "f", "off"}:
        return False
    raise ValueError(f"model parameter {name}={value!r} is not a boolean")


def parse_positive_int(value: str | None, default: int, name: str) -> int:
    if value is None or not value.strip():
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"model parameter {name}={value!r} is not a whole number of at least 1")
    return number
