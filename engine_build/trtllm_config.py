"""The parameters of a TensorRT-LLM engine model's config (model_repository/tensorrt_llm/config.pbtxt).

The template declares every parameter of upstream's 1.2 template under upstream's placeholder names
(engine_build/upstream_parameters.py). `engine_parameter_values` fills the ones this repository sets and leaves every
other one exactly as upstream's fill_template.py leaves a key nobody filled: the text `${placeholder}`, which the
1.2.1 backend reads as unset (the guided-decoding keys by comparing with it, the typed ones by failing to convert it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from engine_build.upstream_parameters import UPSTREAM_TEMPLATE_PARAMETERS, upstream_placeholder

GuidedDecoding = Literal["xgrammar", "none"]
# Beside each engine, in its version folder: the file TensorRT-LLM's C++ backend reads when guided decoding is on.
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"
# What every engine of this repository runs with, whatever the profile (upstream's template leaves them to the user).
FIXED_PARAMETERS = {
    "max_beam_width": 1,  # the engines are built with --max_beam_width 1
    "batching_strategy": "inflight_fused_batching",  # gpt_model_type: in-flight batching
    # How often the backend asks Triton whether a client left (its default is 100 ms): a stream stops sooner.
    "cancellation_check_period_ms": 50,
    "normalize_log_probs": True,
    "decoding_mode": "top_k_top_p",
}


class EngineConfigError(ValueError):
    pass


def unset(placeholder: str) -> str:
    return f"${{{placeholder}}}"


def template_placeholders() -> list[str]:
    """The placeholders of the template's parameters (keys whose upstream value is a literal have none)."""
    return [p for p in (upstream_placeholder(key) for key, _ in UPSTREAM_TEMPLATE_PARAMETERS) if p is not None]


def engine_parameter_values(set_values: Mapping[str, object]) -> dict[str, object]:
    """A value for every parameter placeholder of the template: `set_values` (by placeholder name), the others unset."""
    placeholders = template_placeholders()
    unknown = sorted(set(set_values) - set(placeholders))
    if unknown:
        raise EngineConfigError(f"{unknown} are not parameters of upstream's tensorrt_llm template")
    return {p: set_values[p] if p in set_values else unset(p) for p in placeholders}


def guided_decoding_values(guided_decoding: GuidedDecoding, served_version_dir: Path) -> dict[str, str]:
    """xgrammar_tokenizer_info_path (absolute, where the repository is served: the C++ backend opens it as given) and
    guided_decoding_backend for xgrammar; nothing for "none". tokenizer_dir stays unset either way, as
    tensorrtllm_backend r26.07 docs/guided_decoding.md ("C++ Backend") fills the template: the C++ backend only logs
    that it ignores it (getGuidedDecodingConfigFromParams)."""
    if guided_decoding == "none":
        return {}
    if guided_decoding != "xgrammar":
        raise EngineConfigError(
            f"guided decoding {guided_decoding!r}: TensorRT-LLM 1.2.1's backend knows only xgrammar")
    return {
        "xgrammar_tokenizer_info_path": str(served_version_dir / XGRAMMAR_TOKENIZER_INFO),
        "guided_decoding_backend": "xgrammar",
    }
