"""A STAND-IN for TensorRT-LLM 1.2.x's LLM API (`tensorrt_llm.LLM`, `SamplingParams`, ...), running the embedded CPU
engine. A repository whose `tensorrt_llm` model has `llm: stand_in` uses it; one built for TensorRT-LLM
(`llm: tensorrt_llm`) never does (llmapi_engine/llm_api.py)."""

from llmapi_engine.stand_in.llm import LLM
from llmapi_engine.stand_in.llm_args import NGramDecodingConfig, update_llm_args_with_extra_dict
from llmapi_engine.stand_in.outputs import CompletionOutput, RequestOutput
from llmapi_engine.stand_in.request import LoRARequest
from llmapi_engine.stand_in.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "CompletionOutput", "GuidedDecodingParams", "LoRARequest", "NGramDecodingConfig", "RequestOutput",
           "SamplingParams", "update_llm_args_with_extra_dict"]
