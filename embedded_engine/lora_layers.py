"""Applying LoRA adapters inside a transformers Llama: each targeted projection adds x @ A^T @ B^T of the adapter
of the sequence being run.

The engine runs one sequence per forward pass (embedded_engine.scheduler), so the adapter is chosen per forward:
`LoraSlot.use(adapter)` around the pass, on the engine's one thread. A batch whose sequences use different adapters,
or none, is served exactly: every sequence's passes see only its own adapter. B carries the adapter's scaling (the
backend's format, embedded_engine.lora), which is what PEFT computes as lora_B(lora_A(x)) * scaling.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from embedded_engine.lora import MODULES_BY_NAME, LoraAdapter, LoraLayout


class LoraSlot:
    """The adapter of the forward pass in progress (None: the base model)."""

    def __init__(self) -> None:
        self.adapter: LoraAdapter | None = None

    @contextmanager
    def use(self, adapter: LoraAdapter | None) -> Iterator[None]:
        self.adapter = adapter
        try:
            yield
        finally:
            self.adapter = None


class LoraLinear(torch.nn.Module):
    """A projection and the low-rank update of whichever adapter the slot holds for (module, layer)."""

    def __init__(self, base: torch.nn.Linear, key: tuple[str, int], slot: LoraSlot):
        super().__init__()
        self.base = base
        self.key = key
        self.slot = slot

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base(x)
        adapter = self.slot.adapter
        pair = None if adapter is None else adapter.weights.get(self.key)
        if pair is None:
            return result
        a, b = (torch.from_numpy(weight) for weight in pair)  # views of the adapter's fp32 arrays, no copy
        return result + (x @ a.T) @ b.T


def install_lora(model, layout: LoraLayout) -> LoraSlot:
    """Wrap every projection `layout.modules` names in every decoder layer of `model` (a LlamaForCausalLM); returns
    the slot its forward passes read the adapter from."""
    slot = LoraSlot()
    for index, layer in enumerate(model.model.layers):
        for name in layout.modules:
            parent_name, attribute = MODULES_BY_NAME[name].path.split(".")
            parent = getattr(layer, parent_name)
            base = getattr(parent, attribute)
            if (base.in_features, base.out_features) != layout.shape(name):
                raise ValueError(f"layer {index} {name}: the model's {base.in_features} -> {base.out_features} is "
                                 f"not the layout's {layout.shape(name)}")
            setattr(parent, attribute, LoraLinear(base, (name, index), slot))
    return slot
