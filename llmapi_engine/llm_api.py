"""Which LLM API a repository's `tensorrt_llm` runs: TensorRT-LLM's own, or the stand-in. Chosen by the model's `llm`
parameter, once, at load; never by what happens to be installed.

- `tensorrt_llm`: TensorRT-LLM 1.2.x (the 26.07 container). Imported where NVIDIA's llmapi model imports them
  (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py@b35ac1b: `from tensorrt_llm import LLM, SamplingParams`,
  `from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict`), GuidedDecodingParams from
  tensorrt_llm/sampling_params.py and LoRARequest from tensorrt_llm/executor/request.py. Without TensorRT-LLM the
  load fails, naming it: such a repository never falls back to the stand-in.
- `stand_in`: llmapi_engine.stand_in, the embedded CPU engine behind the same surface (make serve ENGINE=llmapi).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LLM_CHOICES = ("tensorrt_llm", "stand_in")


class LlmApiUnavailable(RuntimeError):
    """The repository's `llm` cannot be imported here."""


@dataclass(frozen=True)
class LlmApi:
    name: str  # one of LLM_CHOICES
    LLM: Any
    SamplingParams: Any
    GuidedDecodingParams: Any
    LoRARequest: Any
    update_llm_args_with_extra_dict: Any


def load_llm_api(name: str) -> LlmApi:
    if name == "tensorrt_llm":
        try:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.executor.request import LoRARequest
            from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
            from tensorrt_llm.sampling_params import GuidedDecodingParams
        except ImportError as error:
            raise LlmApiUnavailable(
                f"llm: tensorrt_llm: this repository runs TensorRT-LLM's LLM API, and importing tensorrt_llm failed "
                f"({error}); serve it in the TensorRT-LLM container (26.07), or build a repository for this host "
                "(make repo ENGINE=llmapi without a GPU uses the stand-in)") from None
        return LlmApi(name, LLM, SamplingParams, GuidedDecodingParams, LoRARequest, update_llm_args_with_extra_dict)
    if name == "stand_in":
        from llmapi_engine import stand_in

        return LlmApi(name, stand_in.LLM, stand_in.SamplingParams, stand_in.GuidedDecodingParams,
                      stand_in.LoRARequest, stand_in.update_llm_args_with_extra_dict)
    raise ValueError(f"llm: {name!r} is not one of {', '.join(LLM_CHOICES)}")
