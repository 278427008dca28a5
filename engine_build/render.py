"""Render config.pbtxt templates and prove every result is a valid Triton ModelConfig.

Templates use `${key}` placeholders. Unlike upstream's fill_template.py, rendering is strict: a key the
template does not use, or a placeholder left unfilled, is an error, and the rendered text must parse as
a `inference.ModelConfig` protobuf (the schema tritonserver itself parses).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

from bls.contract import CONTRACTS, ensemble_scheduling_pbtxt

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Filled automatically from bls/contract.py: the model's input/output blocks, and the ensemble's steps
# (which need the `tensorrt_llm_model_name` value).
TENSORS_KEY = "tensors"
ENSEMBLE_KEY = "ensemble_scheduling"
# A relay (relay/) forwards each input in the shape its backend sees, after its config's reshapes: its
# config declares the tensors without them, and the Python model behind it applies its own.
RELAY_BACKEND = 'backend: "llama3_relay"'


class TemplateError(ValueError):
    pass


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def render_template(text: str, values: Mapping[str, object], source: str) -> str:
    wanted = placeholders(text)
    unknown = sorted(set(values) - wanted)
    missing = sorted(wanted - set(values))
    if unknown:
        raise TemplateError(f"{source}: unknown template keys {unknown} (the template uses {sorted(wanted)})")
    if missing:
        raise TemplateError(f"{source}: unfilled template keys {missing}")
    return PLACEHOLDER.sub(lambda m: _format(values[m.group(1)]), text)


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _model_config_schema():
    """Triton's ModelConfig message, from tritonclient; None where it cannot be imported (the NGC server
    container need not have tritonclient, and its protobuf may refuse that package's generated code)."""
    try:
        from tritonclient.grpc import model_config_pb2
    except Exception as error:  # noqa: BLE001 - ImportError, or protobuf's gencode/runtime version errors
        if not _warned:
            _warned.append(True)
            print(f"[render] Triton's ModelConfig schema is not importable here ({type(error).__name__}: {error}); "
                  "configs are rendered strictly but not parsed (tritonserver parses them at load)", file=sys.stderr)
        return None
    return model_config_pb2.ModelConfig


_warned: list[bool] = []


def parse_model_config(text: str, source: str):
    """The rendered text as a ModelConfig protobuf (None when the schema is not importable here)."""
    schema = _model_config_schema()
    if schema is None:
        return None
    from google.protobuf import text_format

    try:
        return text_format.Parse(text, schema())
    except text_format.ParseError as error:
        raise TemplateError(f"{source}: rendered config is not a valid Triton ModelConfig: {error}") from error


def render_model_config(template: Path, values: Mapping[str, object], contract_name: str | None = None) -> str:
    """Render one template; `${tensors}` comes from the contract of `contract_name` (if the template uses it)."""
    text = template.read_text()
    values = dict(values)
    if TENSORS_KEY in placeholders(text):
        if contract_name not in CONTRACTS:
            raise TemplateError(f"{template}: uses ${{{TENSORS_KEY}}} but no contract named {contract_name!r}")
        values[TENSORS_KEY] = CONTRACTS[contract_name].to_pbtxt(reshape=RELAY_BACKEND not in text)
    if ENSEMBLE_KEY in placeholders(text):
        values[ENSEMBLE_KEY] = ensemble_scheduling_pbtxt(values.pop("tensorrt_llm_model_name"))
    rendered = render_template(text, values, str(template))
    parse_model_config(rendered, str(template))
    return rendered
