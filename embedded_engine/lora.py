"""LoRA adapters as TensorRT-LLM 1.2.1's runtime takes them: the tensor format, the checks, the cache, the prefetch dir.

Torch-free (numpy only), so the repository builder converts adapters with the same definitions the engine reads them
with; embedded_engine.lora_layers applies them to the model. Sources (read for /work/shared/reference/lora-1.2.md):
- module ids: TensorRT-LLM cpp/include/tensorrt_llm/runtime/loraModule.h and tensorrt_llm/lora_manager.py
  (LoraManager.LORA_MODULE_IDS); PEFT's Llama names from examples/hf_lora_convert.py@05316d3
  (hf_modules_to_trtllm_modules: gate_proj -> mlp_h_to_4h, up_proj -> mlp_gate, down_proj -> mlp_4h_to_h).
- `lora_config` [N, 3] int32, one row per (module, layer): `[module_id, layer, rank]` (1.x accepts a 4th column,
  is_dora; Triton's config declares 3). `lora_weights` [N, W]: each row flatten(A [rank, in]) then
  flatten(B [out, rank]), B already multiplied by the adapter's scaling (alpha/rank, alpha/sqrt(rank) with rsLoRA),
  zero-padded to the longest row (hf_lora_convert.py). A module then adds x @ A^T @ B^T: the runtime scales nothing.
- checks: cpp/tensorrt_llm/runtime/loraUtils.cpp (both tensors or neither, same row count, 0 <= layer < layers,
  0 < rank <= max_lora_rank, the module built into the engine, a row long enough).
- cache: cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp. A task's first request carries its weights, later ones
  its id alone; an id the cache does not hold is an error ("LoRA task <id> not found in cache. Please send LoRA
  weights with request"); the cache is bounded, the least recently used adapter evicted first. Here an evicted
  adapter stays alive for the requests already running with it (they hold it), so eviction never changes a
  running request's output. The repository's own adapters (the prefetched ones) are pinned: never evicted, and a
  request may send their weights again but not other weights under their task ids (a client must not replace the
  adapter every other client selects by name).
- prefetch (the backend's lora_prefetch_dir, model_instance_state.cc): `<dir>/<task id>/model.lora_weights.npy`
  [1, N, W] and `model.lora_config.npy` [1, N, 3], loaded into the cache at start-up; folders whose name is not
  all digits are skipped with a warning.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bls.errors import InvalidRequest

log = logging.getLogger(__name__)

# TensorRT-LLM's module ids (LoraManager.LORA_MODULE_IDS, lora_manager.py@30e6fb5), every one, so that an error names
# the module a row asks for even where this engine has no such module.
TRTLLM_MODULE_IDS: dict[str, int] = {
    "attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5, "mlp_4h_to_h": 6,
    "mlp_gate": 7, "cross_attn_qkv": 8, "cross_attn_q": 9, "cross_attn_k": 10, "cross_attn_v": 11,
    "cross_attn_dense": 12, "moe_h_to_4h": 13, "moe_4h_to_h": 14, "moe_gate": 15, "moe_router": 16,
    "mlp_router": 17, "mlp_gate_up": 18,
}
MODULE_NAMES = {module_id: name for name, module_id in TRTLLM_MODULE_IDS.items()}


@dataclass(frozen=True)
class LlamaLoraModule:
    """A projection of a Llama decoder layer that PEFT can target: its TensorRT-LLM name, PEFT's name, where it sits."""

    name: str  # TensorRT-LLM's (lora_config's module id, --lora_target_modules)
    peft_name: str  # PEFT's target_modules name
    path: str  # attribute path in a transformers LlamaDecoderLayer

    @property
    def module_id(self) -> int:
        return TRTLLM_MODULE_IDS[self.name]


LLAMA_MODULES: tuple[LlamaLoraModule, ...] = (
    LlamaLoraModule("attn_q", "q_proj", "self_attn.q_proj"),
    LlamaLoraModule("attn_k", "k_proj", "self_attn.k_proj"),
    LlamaLoraModule("attn_v", "v_proj", "self_attn.v_proj"),
    LlamaLoraModule("attn_dense", "o_proj", "self_attn.o_proj"),
    LlamaLoraModule("mlp_h_to_4h", "gate_proj", "mlp.gate_proj"),
    LlamaLoraModule("mlp_4h_to_h", "down_proj", "mlp.down_proj"),
    LlamaLoraModule("mlp_gate", "up_proj", "mlp.up_proj"),
)
MODULES_BY_NAME = {module.name: module for module in LLAMA_MODULES}
MODULES_BY_PEFT_NAME = {module.peft_name: module for module in LLAMA_MODULES}

# What `--max_lora_rank` defaults to in trtllm-build (tensorrt_llm/commands/build.py) and the backend's cache default
# (lora_cache_host_memory_bytes, model_instance_state.cc getPeftCacheConfigFromParams).
DEFAULT_MAX_LORA_RANK = 64
DEFAULT_LORA_CACHE_BYTES = 1 << 30
PREFETCH_WEIGHTS = "model.lora_weights.npy"
PREFETCH_CONFIG = "model.lora_config.npy"


@dataclass(frozen=True)
class LoraLayout:
    """What an engine was built for: its dims, the modules it applies LoRA to, the largest rank it takes."""

    num_layers: int
    hidden_size: int
    q_size: int  # num_attention_heads * head_dim
    kv_size: int  # num_key_value_heads * head_dim
    intermediate_size: int
    modules: tuple[str, ...]  # TensorRT-LLM names
    max_rank: int

    @classmethod
    def from_config(cls, config, modules: tuple[str, ...], max_rank: int) -> LoraLayout:
        """`config`: a transformers LlamaConfig (or anything with its fields)."""
        unknown = [name for name in modules if name not in MODULES_BY_NAME]
        if unknown:
            raise ValueError(f"lora_target_modules: {unknown} are not Llama modules (choose from "
                             f"{[m.name for m in LLAMA_MODULES]})")
        if max_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {max_rank}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads * head_dim,
                   kv_heads * head_dim, config.intermediate_size, tuple(modules), max_rank)

    def shape(self, module: str) -> tuple[int, int]:
        """(in, out) features of `module`."""
        hidden, q, kv, inter = self.hidden_size, self.q_size, self.kv_size, self.intermediate_size
        return {"attn_q": (hidden, q), "attn_k": (hidden, kv), "attn_v": (hidden, kv), "attn_dense": (q, hidden),
                "mlp_h_to_4h": (hidden, inter), "mlp_gate": (hidden, inter), "mlp_4h_to_h": (inter, hidden)}[module]


_serials = itertools.count(1)


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """One task's weights, checked against the engine: (module, layer) -> (A [rank, in], B [out, rank]), fp32, B scaled.

    `serial` tells two loads of one task id apart (the KV cache of a sequence is reusable only under the very same
    weights)."""

    task_id: int
    weights: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]
    digest: bytes = b""  # of the tensors it was parsed from: the same tensors sent again are the same adapter
    serial: int = field(default_factory=lambda: next(_serials))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())

    @property
    def max_rank(self) -> int:
        return max((a.shape[0] for a, _ in self.weights.values()), default=0)


def _unbatched(array: np.ndarray) -> np.ndarray:
    return array[0] if array.ndim == 3 and array.shape[0] == 1 else array


def adapter_from_tensors(task_id: int, weights: np.ndarray, config: np.ndarray, layout: LoraLayout) -> LoraAdapter:
    """Parse one task's `lora_weights` [N, W] and `lora_config` [N, 3] (a leading batch dim of 1 is accepted, as in
    the prefetch files), with loraUtils.cpp's checks; every problem an InvalidRequest naming the tensor and row."""
    weights, config = _unbatched(np.asarray(weights)), _unbatched(np.asarray(config))
    if weights.ndim != 2:
        raise InvalidRequest("lora_weights", f"must have shape [rows, values], got {list(weights.shape)}")
    if config.ndim != 2 or config.shape[1] not in (3, 4):
        raise InvalidRequest("lora_config", f"must have shape [rows, 3] (module_id, layer, rank), got "
                                            f"{list(config.shape)}")
    if not np.issubdtype(config.dtype, np.integer):
        raise InvalidRequest("lora_config", f"must be integers, got {config.dtype}")
    if not np.issubdtype(weights.dtype, np.floating):
        raise InvalidRequest("lora_weights", f"must be floating point, got {weights.dtype}")
    if weights.shape[0] != config.shape[0]:
        raise InvalidRequest("lora_weights", f"has {weights.shape[0]} rows, lora_config {config.shape[0]}: one "
                                             "row of each per (module, layer)")
    if config.shape[0] == 0:
        raise InvalidRequest("lora_config", "has no rows")
    if not np.isfinite(weights).all():
        raise InvalidRequest("lora_weights", "holds NaN or infinite values")
    parsed: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    for row, values in enumerate(config.tolist()):
        module_id, layer, rank = values[:3]
        where = f"row {row} (module {module_id}, layer {layer}, rank {rank})"
        if len(values) == 4 and values[3] != 0:
            raise InvalidRequest("lora_config", f"{where}: DoRA (is_dora=1) is not supported")
        name = MODULE_NAMES.get(module_id)
        if name is None:
            raise InvalidRequest("lora_config", f"{where}: {module_id} is not a TensorRT-LLM LoRA module id")
        if name not in layout.modules:
            raise InvalidRequest("lora_config", f"{where}: lora module {name} not enabled for this model (built "
                                                f"for {', '.join(layout.modules)})")
        if not 0 <= layer < layout.num_layers:
            raise InvalidRequest("lora_config", f"{where}: layer must be in [0, {layout.num_layers})")
        if not 0 < rank <= layout.max_rank:
            raise InvalidRequest("lora_config", f"{where}: rank must be in [1, max_lora_rank {layout.max_rank}]")
        if (name, layer) in parsed:
            raise InvalidRequest("lora_config", f"{where}: a second row for {name} in layer {layer}")
        fan_in, fan_out = layout.shape(name)
        size = rank * (fan_in + fan_out)
        if size > weights.shape[1]:
            raise InvalidRequest("lora_weights", f"{where}: needs {size} values (rank x (in {fan_in} + out "
                                                 f"{fan_out})), the row has {weights.shape[1]}")
        flat = weights[row].astype(np.float32)
        a = flat[: rank * fan_in].reshape(rank, fan_in).copy()
        b = flat[rank * fan_in : size].reshape(fan_out, rank).copy()
        parsed[(name, layer)] = (a, b)
    return LoraAdapter(int(task_id), parsed, tensors_digest(weights, config))


def tensors_digest(weights: np.ndarray, config: np.ndarray) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for array in (weights, config):
        digest.update(str((array.dtype.str, array.shape)).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.digest()


class LoraCache:
    """Adapters by task id, at most `capacity_bytes` of weights, least recently used evicted first. Thread-safe:
    requests are parsed on Triton's threads, the engine reads the adapters they resolved to."""

    def __init__(self, layout: LoraLayout, capacity_bytes: int = DEFAULT_LORA_CACHE_BYTES):
        if capacity_bytes <= 0:
            raise ValueError(f"lora_cache_host_memory_bytes must be > 0, got {capacity_bytes}")
        self.layout = layout
        self.capacity_bytes = capacity_bytes
        self._adapters: OrderedDict[int, LoraAdapter] = OrderedDict()
        self._pinned: set[int] = set()  # the repository's adapters (prefetched): never evicted or replaced
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self._adapters

    def task_ids(self) -> list[int]:
        """Cached ids, least recently used first."""
        with self._lock:
            return list(self._adapters)

    def resolve(self, task_id: int | None, weights: np.ndarray | None, config: np.ndarray | None) -> LoraAdapter | None:
        """The adapter of one request: its weights, parsed and cached (replacing the task's earlier ones), or the
        cached weights of its task id. None without a task id and weights (no LoRA). Weights sent again for a task
        that holds the very same ones (a client that always sends them, the BLS's speculative rounds) are not parsed
        again: the cached adapter serves, and with it the KV cache its sequences left."""
        if weights is None and config is None:
            return None if task_id is None else self.get(task_id)
        if weights is None or config is None:
            missing, given = ("lora_weights", "lora_config") if weights is None else ("lora_config", "lora_weights")
            raise InvalidRequest(missing, f"is required with {given} (both or neither)")
        if task_id is None:
            raise InvalidRequest("lora_task_id", "is required with lora_weights and lora_config (the id later "
                                                 "requests of this adapter send alone)")
        weights, config = np.asarray(weights), np.asarray(config)
        with self._lock:
            cached = self._adapters.get(task_id)
            if cached is not None and cached.digest == tensors_digest(_unbatched(weights), _unbatched(config)):
                self._adapters.move_to_end(task_id)
                return cached
        adapter = adapter_from_tensors(task_id, weights, config, self.layout)
        self.put(adapter)
        return adapter

    def get(self, task_id: int) -> LoraAdapter:
        with self._lock:
            adapter = self._adapters.get(task_id)
            if adapter is not None:
                self._adapters.move_to_end(task_id)
                return adapter
        raise InvalidRequest("lora_task_id", f"LoRA task {task_id} not found in cache. Please send LoRA weights "
                                             "with request")

    def put(self, adapter: LoraAdapter, pinned: bool = False) -> None:
        """Cache `adapter` (replacing its task's earlier weights), evicting the least recently used unpinned ones
        while it does not fit; pinned: one of the repository's adapters."""
        with self._lock:
            if adapter.task_id in self._pinned and not pinned:
                raise InvalidRequest("lora_weights", f"LoRA task {adapter.task_id} is one of this repository's "
                                                     "adapters (prefetched): a request cannot replace its weights; "
                                                     "send its task id alone, or other weights under another id")
            old = self._adapters.pop(adapter.task_id, None)
            if old is not None:
                self._bytes -= old.nbytes
            evictable = [task_id for task_id in self._adapters if task_id not in self._pinned]  # LRU first
            room = self.capacity_bytes - self._bytes + sum(self._adapters[t].nbytes for t in evictable)
            if adapter.nbytes > room:
                if old is not None:
                    self._adapters[adapter.task_id] = old
                    self._bytes += old.nbytes
                raise InvalidRequest("lora_weights", f"LoRA task {adapter.task_id} needs {adapter.nbytes} bytes; the "
                                                     f"cache holds {self.capacity_bytes} "
                                                     f"(lora_cache_host_memory_bytes), {self.capacity_bytes - room} "
                                                     "of them for the repository's own adapters")
            for task_id in evictable:
                if self._bytes + adapter.nbytes <= self.capacity_bytes:
                    break
                evicted = self._adapters.pop(task_id)
                self._bytes -= evicted.nbytes
                log.info("LoRA cache full: evicted task %d (%d bytes), least recently used", task_id, evicted.nbytes)
            self._adapters[adapter.task_id] = adapter
            self._bytes += adapter.nbytes
            if pinned:
                self._pinned.add(adapter.task_id)


def read_prefetch_adapter(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """One task's (weights, config) arrays from a prefetch folder, as written for the backend."""
    files = [folder / PREFETCH_WEIGHTS, folder / PREFETCH_CONFIG]
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing (a prefetch folder holds {PREFETCH_WEIGHTS} and "
                                    f"{PREFETCH_CONFIG})")
    weights, config = (np.load(file, allow_pickle=False) for file in files)
    return weights, config


def prefetch(cache: LoraCache, directory: Path) -> list[int]:
    """Load every `<directory>/<task id>/` into the cache, as the backend does at start-up; returns the task ids.
    A folder that does not load fails the model's load with its path: a repository serving an adapter it cannot
    read is broken."""
    if not directory.is_dir():
        raise FileNotFoundError(f"lora_prefetch_dir {directory} is not a directory")
    loaded = []
    for folder in sorted(directory.iterdir(), key=lambda path: path.name):
        if not folder.is_dir():
            continue
        if not folder.name.isdigit():
            log.warning("lora_prefetch_dir: %s is skipped: its name is not a task id (digits)", folder)
            continue
        weights, config = read_prefetch_adapter(folder)
        try:
            cache.put(adapter_from_tensors(int(folder.name), weights, config, cache.layout), pinned=True)
        except InvalidRequest as error:
            raise ValueError(f"lora_prefetch_dir {folder}: {error.field} {error.problem}") from None
        loaded.append(int(folder.name))
    return loaded
