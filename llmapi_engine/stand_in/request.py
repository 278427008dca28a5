"""The stand-in's LoRARequest, with upstream's fields (tensorrt_llm/executor/request.py@4ce835a; docs/llmapi.md's
sources): lora_name, lora_int_id, lora_path (the adapter's folder), lora_ckpt_source ('hf' | 'nemo'); as upstream's
__post_init__, a lora_path that does not exist is a ValueError. The stand-in's LLM loads the Hugging Face PEFT folder
(stand_in/llm.py) under lora_int_id."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if not os.path.exists(self.lora_path):
            raise ValueError(f"LoRARequest.lora_path {self.lora_path!r} does not exist")
