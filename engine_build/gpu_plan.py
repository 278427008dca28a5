"""The TensorRT-LLM engine's sizes and runtime settings, decided before a GPU is paid for.

A profile is a documented set of `trtllm-build` sizes and tensorrtllm backend parameters; any value can be
overridden alone. The capacity check turns the model's shape (from its HF config.json), the KV-cache dtype,
`max_seq_len`, the GPU's memory and the weights' size into the number of full-length sequences the KV cache
holds, the arithmetic `trtllm-bench` uses to size its engines (tensorrt_llm/bench/build/tuning.py of the 1.2
line: weights subtracted from the GPUs' memory, the KV-cache fraction of the rest, divided by the bytes a
token's keys and values take, with at least one KV head per tensor-parallel rank).

Sources of the defaults (each value says which):
- TensorRT-LLM 1.2 docs, "Best Practices for Tuning the Performance" and the performance-tuning guide
  ("Tuning Max Batch Size and Max Num Tokens", "Useful Runtime Options"): build a high enough
  max_batch_size, max_num_tokens 8192 as the starting point, chunked context, GUARANTEED_NO_EVICT as the
  production scheduler policy, KV-cache block reuse.
- TensorRT-LLM's KvCacheConfig: free_gpu_memory_fraction defaults to 0.9.
- The seed deployments: batch 128 (Llama 3 8B fp16 on an A100-40GB, 4,500 output tok/s) and batch 256 with
  chunked prompts and kv_cache_free_gpu_mem_fraction 0.9 (the DataCrunch LLaMA workflow).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

GiB = 1024**3
KvCacheDtype = Literal["auto", "fp8"]
# Hopper and Ada run FP8 (compute capability 8.9 and up); TensorRT-LLM's FP8 KV cache needs them.
FP8_MIN_COMPUTE_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Profile:
    """Engine sizes (trtllm-build) and backend parameters of one serving profile."""

    name: str
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int
    max_seq_len: int
    enable_chunked_context: bool
    batch_scheduler_policy: str
    kv_cache_free_gpu_mem_fraction: float  # the target alone on its GPUs
    enable_kv_cache_reuse: bool
    max_queue_delay_microseconds: int


PROFILES = {
    "throughput": Profile(
        name="throughput",
        # Many users at once: the seeds serve an 8B model at batch 128 and 256; the tuning guide says to build
        # high and let the runtime (KV cache, max_num_tokens) decide the live batch.
        max_batch_size=256,
        # trtllm-build's default and the tuning guide's starting point; with chunked context a long prompt is
        # split over steps instead of needing max_num_tokens >= max_input_len.
        max_num_tokens=8192,
        max_input_len=3072,
        max_seq_len=4096,
        # Prompts are chunked into max_num_tokens-sized pieces and scheduled beside generation steps.
        enable_chunked_context=True,
        # TensorRT-LLM's default, documented as the production choice: a started request is never paused.
        # MAX_UTILIZATION packs more but may pause requests when the KV cache fills (latency spikes).
        batch_scheduler_policy="guaranteed_no_evict",
        # KvCacheConfig's default and the DataCrunch workflow's: the GPU holds only this engine.
        kv_cache_free_gpu_mem_fraction=0.9,
        # Chat traffic repeats system prompts and earlier turns: reused blocks skip their prefill.
        enable_kv_cache_reuse=True,
        max_queue_delay_microseconds=0,
    ),
    "latency": Profile(
        name="latency",
        # Interactive, a few users: a small batch keeps every step short.
        max_batch_size=8,
        # A whole 8k prompt in one step: the lowest time to first token for long prompts.
        max_num_tokens=8192,
        max_input_len=3072,
        max_seq_len=4096,
        enable_chunked_context=True,
        batch_scheduler_policy="guaranteed_no_evict",
        kv_cache_free_gpu_mem_fraction=0.9,
        enable_kv_cache_reuse=True,
        max_queue_delay_microseconds=0,
    ),
}

# With a draft on the same GPUs the order in which Triton loads the two models is not fixed, and each takes
# its fraction of the memory free at that moment. The target takes 0.7 of it; the draft takes up to 0.9 of
# what is free but no more tokens than the target's cache holds (max_tokens_in_paged_kv_cache), so it
# cannot starve the target whichever loads first. A 1B draft's tokens cost a quarter of an 8B target's.
TARGET_KV_FRACTION_WITH_DRAFT = 0.7
DRAFT_KV_FRACTION = 0.9


def profile_with(name: str, **overrides) -> Profile:
    """The named profile with single values replaced (None: keep the profile's)."""
    if name not in PROFILES:
        raise SystemExit(f"PROFILE={name!r} is not a profile; choose one of {sorted(PROFILES)}")
    profile = dataclasses.replace(PROFILES[name], **{k: v for k, v in overrides.items() if v is not None})
    if profile.max_input_len >= profile.max_seq_len:
        raise SystemExit(f"max_input_len ({profile.max_input_len}) must be below max_seq_len ({profile.max_seq_len})")
    if not profile.enable_chunked_context and profile.max_num_tokens < profile.max_input_len:
        raise SystemExit(f"max_num_tokens ({profile.max_num_tokens}) below max_input_len ({profile.max_input_len}) "
                         "needs chunked context (ENABLE_CHUNKED_CONTEXT=true)")
    return profile


@dataclass(frozen=True)
class ModelShape:
    """What sizes a Llama model's weights and KV cache, read from its HF config.json."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    checkpoint_dtype_bytes: int = 2  # the HF weights' element size (bf16 for Llama 3)

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelShape:
        heads = int(config["num_attention_heads"])
        dtype = str(config.get("torch_dtype") or config.get("dtype"))
        return cls(
            num_hidden_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            checkpoint_dtype_bytes=4 if dtype.endswith("float32") else 2,
        )

    def linear_params(self) -> int:
        """Parameters of the attention and MLP projections (what AWQ quantizes)."""
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_key_value_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_hidden_layers * (q_and_o + k_and_v + mlp)

    def embedding_params(self) -> int:
        """Input embedding and lm_head (not quantized by AWQ: the lm_head stays 16-bit)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def weight_bytes(self, quantization: Literal["awq", "none"], group_size: int = 128) -> int:
        """Engine weights of all ranks: int4 AWQ linears with one fp16 scale per group, or 16 bits."""
        if quantization == "awq":
            linears = self.linear_params() // 2 + self.linear_params() // group_size * 2
        else:
            linears = self.linear_params() * 2
        return linears + self.embedding_params() * 2

    def checkpoint_bytes(self) -> int:
        """The HF model's weights as loaded for quantization (its own dtype)."""
        return self.weight_bytes("none") // 2 * self.checkpoint_dtype_bytes

    def kv_bytes_per_token(self, kv_cache_dtype: KvCacheDtype, tp_size: int) -> int:
        """Keys and values of one token on one GPU: every rank holds at least one KV head."""
        heads_per_rank = max(1, math.ceil(self.num_key_value_heads / tp_size))
        element = 1 if kv_cache_dtype == "fp8" else 2
        return 2 * self.num_hidden_layers * heads_per_rank * self.head_dim * element


@dataclass(frozen=True)
class Capacity:
    """How many full-length sequences the KV cache holds, per the numbers it was computed from."""

    gpu_memory_bytes: int  # one GPU
    gpus: int
    weight_bytes: int  # all ranks, target (and draft when there is one)
    kv_cache_fraction: float
    kv_bytes_per_token: int  # per GPU
    max_seq_len: int
    max_batch_size: int

    @property
    def kv_cache_bytes_per_gpu(self) -> int:
        free = self.gpu_memory_bytes - self.weight_bytes / self.gpus
        return max(0, int(free * self.kv_cache_fraction))

    @property
    def kv_cache_tokens(self) -> int:
        return self.kv_cache_bytes_per_gpu // self.kv_bytes_per_token

    @property
    def full_length_sequences(self) -> int:
        return self.kv_cache_tokens // self.max_seq_len

    @property
    def batch_fits(self) -> bool:
        return self.full_length_sequences >= self.max_batch_size

    def as_dict(self) -> dict:
        return {
            "gpu_memory_gib": round(self.gpu_memory_bytes / GiB, 1), "gpus": self.gpus,
            "weights_gib": round(self.weight_bytes / GiB, 2), "kv_cache_fraction": self.kv_cache_fraction,
            "kv_cache_gib_per_gpu": round(self.kv_cache_bytes_per_gpu / GiB, 2),
            "kv_bytes_per_token": self.kv_bytes_per_token, "kv_cache_tokens": self.kv_cache_tokens,
            "max_seq_len": self.max_seq_len, "full_length_sequences": self.full_length_sequences,
            "max_batch_size": self.max_batch_size, "batch_fits_at_full_length": self.batch_fits,
        }

    def report(self) -> str:
        lines = [
            f"capacity check: {self.gpus} GPU(s) x {self.gpu_memory_bytes / GiB:.1f} GiB, weights "
            f"{self.weight_bytes / GiB:.2f} GiB, KV cache {self.kv_cache_fraction:.2f} of the rest = "
            f"{self.kv_cache_bytes_per_gpu / GiB:.2f} GiB per GPU at {self.kv_bytes_per_token / 1024:.0f} KiB a token",
            f"  -> {self.kv_cache_tokens:,} tokens = {self.full_length_sequences} sequences of max_seq_len "
            f"{self.max_seq_len} (max_batch_size {self.max_batch_size})",
        ]
        if not self.batch_fits:
            lines.append(
                f"  WARNING: max_batch_size {self.max_batch_size} cannot be met at full length: only "
                f"{self.full_length_sequences} sequences of {self.max_seq_len} tokens fit. Shorter requests still "
                "batch higher; to guarantee it, lower MAX_SEQ_LEN or MAX_BATCH_SIZE, use KV_CACHE_DTYPE=fp8, "
                "or add GPUs (TP)")
        return "\n".join(lines)


# Quantization (engine_build/quantize.py) holds the whole HF model in its checkpoint dtype on the GPUs while modelopt
# calibrates it; what each GPU keeps beside the weights: the CUDA context, calibration activations (one 512-token
# sample at a time, logits of the last token only) and AWQ's per-layer search state.
QUANTIZATION_HEADROOM = 0.15


@dataclass(frozen=True)
class QuantizationMemory:
    """Whether an HF model fits the visible GPUs for AWQ calibration, spread over them as TensorRT-LLM 1.2.1's
    examples/quantization/quantize.py spreads it (quantize_by_modelopt.get_model: from_pretrained with
    device_map="auto", the --device_map default)."""

    model_bytes: int  # the HF weights in their checkpoint dtype (16 bits for Llama 3)
    gpus: int
    gpu_memory_bytes: int  # one GPU

    @property
    def usable_bytes(self) -> int:
        return int(self.gpus * self.gpu_memory_bytes * (1 - QUANTIZATION_HEADROOM))

    @property
    def fits(self) -> bool:
        return self.model_bytes <= self.usable_bytes

    @property
    def gpus_needed(self) -> int:
        per_gpu = self.gpu_memory_bytes * (1 - QUANTIZATION_HEADROOM)
        return max(1, math.ceil(self.model_bytes / per_gpu))

    def report(self) -> str:
        head = (f"quantization: {self.model_bytes / GiB:.1f} GiB of 16-bit weights calibrated across {self.gpus} "
                f"GPU(s) x {self.gpu_memory_bytes / GiB:.1f} GiB (device_map auto, {1 - QUANTIZATION_HEADROOM:.0%} of "
                f"each for weights = {self.usable_bytes / GiB:.1f} GiB)")
        if self.fits:
            return head + ": fits"
        return (head + f": does NOT fit; it needs {self.gpus_needed} such GPUs visible to the quantize step "
                f"(CUDA_VISIBLE_DEVICES), or a bigger GPU; quantize on such a machine and build from its checkpoint")


def planned_gpu_memory(gpu_mem_gb: float | None) -> int:
    """The memory of one GPU to plan for: GPU_MEM_GB, else this machine's GPU; neither is a stop naming the fix."""
    memory = int(gpu_mem_gb * GiB) if gpu_mem_gb else gpu_memory_bytes()
    if memory is None:
        raise SystemExit("no NVIDIA GPU found to size the KV cache for: give the memory of the GPU to plan for, "
                         "e.g. GPU_MEM_GB=80 (an H100 80GB)")
    return memory


def fitting_memory(target: ModelShape, profile: Profile, memory: int, weight_bytes: int, kv_cache_fraction: float,
                   kv_cache_dtype: str, tp: int, pp: int) -> tuple[Capacity, QuantizationMemory]:
    """The KV capacity of TP x PP GPUs and the quantize step's memory, for both flows; a stop, before any work, when
    not one full-length sequence fits or the quantize step does not. The quantize step holds the whole 16-bit model
    on the GPUs this machine shows (a dry run: on TP x PP of them)."""
    capacity = Capacity(
        gpu_memory_bytes=memory, gpus=tp * pp, weight_bytes=weight_bytes, kv_cache_fraction=kv_cache_fraction,
        kv_bytes_per_token=target.kv_bytes_per_token(kv_cache_dtype, tp), max_seq_len=profile.max_seq_len,
        max_batch_size=profile.max_batch_size)
    if capacity.kv_cache_tokens < profile.max_seq_len:
        raise SystemExit(capacity.report() + "\nnot one full-length sequence fits: use more GPUs (TP=...), a shorter "
                         "MAX_SEQ_LEN, or KV_CACHE_DTYPE=fp8")
    quantization = QuantizationMemory(model_bytes=target.checkpoint_bytes(), gpus=visible_gpu_count() or tp * pp,
                                      gpu_memory_bytes=memory)
    if not quantization.fits:
        raise SystemExit(quantization.report())
    return capacity, quantization


def gpu_memory_bytes() -> int | None:
    """Total memory of the first visible NVIDIA GPU (nvidia-smi), None without one."""
    answer = _nvidia_smi("memory.total")
    return None if answer is None else int(float(answer)) * 1024**2  # MiB


def visible_gpu_count() -> int | None:
    """How many NVIDIA GPUs this process sees (CUDA_VISIBLE_DEVICES applies), None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    result = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                            text=True, check=False)
    indices = result.stdout.split() if result.returncode == 0 else []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()]) if visible.strip() else 0
    return len(indices) or None


def gpu_compute_capability() -> tuple[int, int] | None:
    answer = _nvidia_smi("compute_cap")
    if answer is None:
        return None
    major, _, minor = answer.partition(".")
    return int(major), int(minor or 0)


def _nvidia_smi(field: str) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    result = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                            capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


def check_fp8_kv_cache(compute_capability: tuple[int, int] | None) -> str | None:
    """None when an FP8 KV cache can run here; otherwise why not (None capability: not checked, said so)."""
    if compute_capability is None:
        return None
    if compute_capability < FP8_MIN_COMPUTE_CAPABILITY:
        major, minor = compute_capability
        return (f"KV_CACHE_DTYPE=fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper); this one is "
                f"{major}.{minor}. Build with KV_CACHE_DTYPE=auto (16-bit) instead")
    return None
