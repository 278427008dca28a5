"""The stand-in's LoRARequest, with upstream's fields (tensorrt_llm/executor/request.py@4ce835a; docs/llmapi.md's
sources): lora_name, lora_int_id, lora_path, lora_ckpt_source ('hf' | 'nemo'). The stand-in's LLM serves no adapters
and refuses a request that names one (stand_in/llm.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"
