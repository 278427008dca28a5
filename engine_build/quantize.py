"""HF Llama checkpoint -> TensorRT-LLM W4A16_AWQ checkpoint, with nvidia-modelopt (CPU or CUDA).

This is the same library and the same two calls TensorRT-LLM's own `examples/quantization/quantize.py`
makes (`mtq.quantize(..., INT4_AWQ_CFG, ...)` then `export_tensorrt_llm_checkpoint`), without needing
tensorrt_llm or a GPU, so the checkpoint `trtllm-build` consumes can be produced anywhere. The
config post-edits mirror that script's, plus a hard check on the RoPE fields: a checkpoint without
`rotary_base` builds an engine with TensorRT-LLM's default base 10000, silently wrong for Llama 3.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

DEFAULT_CALIBRATION_FILE = Path(__file__).parent / "data" / "calibration.txt"
SUPPORTED_ARCHITECTURE = "LlamaForCausalLM"
# TensorRT-LLM's quantize.py caps AWQ calibration at 32 samples; more only costs time.
MAX_CALIB_SAMPLES = 32
# What a Hugging Face export carries besides the weights so that TensorRT-LLM's LLM(model=dir) finds its tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model")
MAX_CALIB_TOKENS = 512
CALIB_SEPARATOR = "\n----\n"
# The quantizations of ModelOpt's Hugging Face export (ENGINE=llmapi) and the quant_algo each writes into
# hf_quant_config.json, which TensorRT-LLM's PyTorch flow reads (_torch/model_config.py, shared/reference/llmapi-1.2.md
# section 5; engine_build/llmapi_flow.py says on which GPUs each loads).
MODELOPT_ALGORITHMS = {"awq": "W4A16_AWQ", "fp8": "FP8"}
HF_QUANT_CONFIG = "hf_quant_config.json"


class QuantizationError(RuntimeError):
    """The checkpoint or the environment cannot give a correct AWQ checkpoint; the message says why."""


def _log(message: str) -> None:
    print(f"[quantize] {message}", file=sys.stderr, flush=True)


def read_calibration_texts(path: Path = DEFAULT_CALIBRATION_FILE) -> list[str]:
    """The samples of a text file, separated by lines holding only `----`.

    Not blank lines: chat-templated samples contain blank lines after each header.
    """
    path = Path(path)
    if not path.is_file():
        raise QuantizationError(f"calibration file {path} does not exist")
    samples = [s.strip() for s in path.read_text(encoding="utf-8").split(CALIB_SEPARATOR)]
    texts = [s for s in samples if s]
    if not texts:
        raise QuantizationError(f"calibration file {path} holds no text")
    return texts


def check_hf_checkpoint(hf_dir: Path, group_size: int) -> dict:
    """The checkpoint's config.json, after checking what AWQ export needs; raises QuantizationError."""
    import transformers

    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        raise QuantizationError(
            f"transformers {transformers.__version__} is installed; the TensorRT-LLM checkpoint export needs "
            "transformers < 5 (4.57.3 matches TensorRT-LLM 1.2.1): under 5.x modelopt cannot see rope_theta "
            "and the exported config would lack rotary_base"
        )
    hf_dir = Path(hf_dir)
    config_file = hf_dir / "config.json"
    if not hf_dir.is_dir():
        raise QuantizationError(f"checkpoint directory {hf_dir} does not exist")
    if not config_file.is_file():
        raise QuantizationError(f"{hf_dir} has no config.json: not a Hugging Face checkpoint")
    config = json.loads(config_file.read_text())
    architectures = config.get("architectures") or []
    if architectures != [SUPPORTED_ARCHITECTURE]:
        raise QuantizationError(
            f"unsupported architecture {architectures} in {config_file}; only {SUPPORTED_ARCHITECTURE} is supported"
        )
    if "rope_theta" not in config:
        raise QuantizationError(f"{config_file} has no rope_theta; the engine's RoPE base would be guessed")
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    in_features = {
        "hidden_size (in-features of q/k/v, gate/up)": hidden,
        "num_attention_heads * head_dim (in-features of o_proj)": config["num_attention_heads"] * head_dim,
        "intermediate_size (in-features of down_proj)": config["intermediate_size"],
    }
    for name, size in in_features.items():
        if size % group_size:
            raise QuantizationError(f"{name} = {size} is not divisible by the AWQ group size {group_size}")
    return config


def calibration_batches(tokenizer, texts: list[str], max_tokens: int = MAX_CALIB_TOKENS) -> list:
    """Token-id tensors (batch 1) of the first MAX_CALIB_SAMPLES texts, BOS included."""
    batches = []
    for text in texts[:MAX_CALIB_SAMPLES]:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)["input_ids"]
        batches.append(ids)
    return batches




def check_gpu_memory_for(hf_dir: Path) -> None:
    """Before loading anything: the HF model must fit the visible GPUs for calibration (QuantizationMemory)."""
    import torch

    from engine_build.gpu_plan import ModelShape, QuantizationMemory

    shape = ModelShape.from_hf_config(json.loads((Path(hf_dir) / "config.json").read_text()))
    gpus = torch.cuda.device_count()
    memory = QuantizationMemory(model_bytes=shape.checkpoint_bytes(), gpus=gpus,
                                gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory)
    if not memory.fits:
        raise QuantizationError(memory.report())
    _log(memory.report())


def awq_calibrated_model(
    hf_dir: Path, calib_texts: list[str], group_size: int, device: str, kv_cache_dtype: str = "auto"
):
    """The HF model with modelopt's fake-quant AWQ int4 weights (the state the export packs); with
    kv_cache_dtype "fp8", FP8 quantizers calibrated on the KV cache too."""
    return calibrated_model(hf_dir, calib_texts, device, "awq", group_size=group_size, kv_cache_dtype=kv_cache_dtype)


def calibrated_model(
    hf_dir: Path, calib_texts: list[str], device: str, algorithm: str, *, group_size: int = 128,
    kv_cache_dtype: str = "auto"
):
    """The HF model with modelopt's fake-quant weights of `algorithm` (MODELOPT_ALGORITHMS: awq = INT4_AWQ_CFG,
    fp8 = FP8_DEFAULT_CFG, per-tensor FP8 weights and activations), calibrated on calib_texts; with kv_cache_dtype
    "fp8", FP8 quantizers calibrated on the KV cache too."""
    import modelopt.torch.quantization as mtq
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer, LlamaForCausalLM

    try:
        # fix_mistral_regex=False: transformers 4.57.3 warns about a Mistral regex bug for any local checkpoint
        # saved by 4.57.3; Llama 3's pattern is not affected.
        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir), fix_mistral_regex=False)
    except (OSError, ValueError) as exc:
        raise QuantizationError(f"cannot load the tokenizer of {hf_dir}: {exc}") from exc
    if device == "cuda":
        # Spread over every visible GPU, as TensorRT-LLM 1.2.1's quantize.py loads it (quantize_by_modelopt.get_model:
        # from_pretrained(device_map="auto")): a 70B model's 141 GB of bf16 fit no single GPU.
        check_gpu_memory_for(hf_dir)
        model = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype="auto", device_map="auto").eval()
    else:
        model = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype="auto").to(device).eval()
    first_device = model.get_input_embeddings().weight.device
    batches = [ids.to(first_device) for ids in calibration_batches(tokenizer, calib_texts)]

    def forward_loop(m) -> None:
        with torch.no_grad():
            for ids in tqdm(batches, desc="[quantize] calibration", file=sys.stderr):
                m(ids, logits_to_keep=1)  # lm_head is not quantized: skip 128k-wide logits

    if algorithm == "awq":
        config = copy.deepcopy(mtq.INT4_AWQ_CFG)
        config["quant_cfg"]["*weight_quantizer"]["block_sizes"][-1] = group_size
    elif algorithm == "fp8":
        config = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    else:
        raise QuantizationError(f"quantization {algorithm!r} is none of {sorted(MODELOPT_ALGORITHMS)}")
    if kv_cache_dtype == "fp8":
        # modelopt's own FP8 KV-cache quantizers (the attention's k/v bmm inputs, e4m3), calibrated with the
        # weights; the export then writes kv_cache_quant_algo FP8, which trtllm-build reads.
        config["quant_cfg"].update(
            {key: value for key, value in mtq.FP8_KV_CFG["quant_cfg"].items() if key != "default"})
    described = f"AWQ int4 (group {group_size})" if algorithm == "awq" else "FP8 (per-tensor)"
    _log(f"{described} on {device}: {len(batches)} calibration samples, "
         f"{sum(b.shape[1] for b in batches)} tokens")
    start = time.perf_counter()
    model = mtq.quantize(model, config, forward_loop)
    _log(f"calibrated in {time.perf_counter() - start:.1f} s")
    return model


def export_trtllm_checkpoint(
    model, hf_config: dict, out_dir: Path, *, tp_size: int, pp_size: int, dtype: str
) -> Path:
    """Write config.json + rank*.safetensors and apply TensorRT-LLM's config post-edits."""
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    out_dir = Path(out_dir)
    start = time.perf_counter()
    export_tensorrt_llm_checkpoint(
        model,
        decoder_type="llama",
        dtype=getattr(torch, dtype),
        export_dir=out_dir,
        inference_tensor_parallel=tp_size,
        inference_pipeline_parallel=pp_size,
    )
    config_file = out_dir / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = "llama"
    config["architecture"] = SUPPORTED_ARCHITECTURE
    _carry_rope_fields(config, hf_config)
    config_file.write_text(json.dumps(config, indent=4) + "\n")
    _log(f"exported {out_dir} in {time.perf_counter() - start:.1f} s")
    return out_dir


def _carry_rope_fields(config: dict, hf_config: dict) -> None:
    """rotary_base == rope_theta and rotary_scaling == rope_scaling, or an error if they disagree."""
    rope_theta = float(hf_config["rope_theta"])
    if config.setdefault("rotary_base", rope_theta) != rope_theta:
        raise QuantizationError(
            f"exported rotary_base {config['rotary_base']} differs from the checkpoint's rope_theta {rope_theta}"
        )
    rope_scaling = hf_config.get("rope_scaling")
    if rope_scaling is not None and config.setdefault("rotary_scaling", rope_scaling) != rope_scaling:
        raise QuantizationError(
            f"exported rotary_scaling {config['rotary_scaling']} differs from the checkpoint's rope_scaling "
            f"{rope_scaling}"
        )


def export_dtype(hf_config: dict) -> str:
    """The checkpoint's torch_dtype, as TensorRT-LLM's quantize.py takes it with --dtype auto: bfloat16 for
    Llama 3 (Meta ships bf16 weights). A float32 checkpoint (our tiny default) exports float16: TensorRT-LLM
    runs the unquantized layers of an AWQ engine in 16 bits."""
    configured = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "float16").removeprefix("torch.")
    return configured if configured in ("bfloat16", "float16") else "float16"


def quantize_awq(
    hf_dir: Path,
    out_dir: Path,
    *,
    calib_texts: list[str] | None = None,
    group_size: int = 128,
    tp_size: int = 1,
    pp_size: int = 1,
    device: str | None = None,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
) -> Path:
    """Quantize an HF LlamaForCausalLM dir to a TensorRT-LLM W4A16_AWQ checkpoint in out_dir.

    calib_texts defaults to engine_build/data/calibration.txt; device to CUDA when available.
    dtype is the type of the unquantized tensors (embeddings, norms, lm_head) in the checkpoint; "auto"
    takes the checkpoint's own (see export_dtype).
    """
    import torch

    hf_dir = Path(hf_dir)
    hf_config = check_hf_checkpoint(hf_dir, group_size)
    dtype = export_dtype(hf_config) if dtype == "auto" else dtype
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = calib_texts if calib_texts is not None else read_calibration_texts()
    model = awq_calibrated_model(hf_dir, texts, group_size, device, kv_cache_dtype)
    return export_trtllm_checkpoint(model, hf_config, out_dir, tp_size=tp_size, pp_size=pp_size, dtype=dtype)


def export_unquantized(hf_dir: Path, out_dir: Path, *, tp_size: int = 1, pp_size: int = 1) -> Path:
    """An HF LlamaForCausalLM dir as an unquantized TensorRT-LLM checkpoint in its own dtype (bf16 for
    Llama 3): the draft model TensorRT-LLM's draft-target support matrix documents (FP16/BF16/FP8)."""
    from transformers import LlamaForCausalLM

    hf_dir = Path(hf_dir)
    hf_config = check_hf_checkpoint(hf_dir, group_size=1)
    model = LlamaForCausalLM.from_pretrained(str(hf_dir), dtype="auto").eval()
    return export_trtllm_checkpoint(model, hf_config, out_dir, tp_size=tp_size, pp_size=pp_size,
                                    dtype=export_dtype(hf_config))


def quantize_modelopt_hf(
    hf_dir: Path,
    out_dir: Path,
    algorithm: str,
    *,
    calib_texts: list[str] | None = None,
    group_size: int = 128,
    device: str | None = None,
    kv_cache_dtype: str = "auto",
) -> Path:
    """An HF LlamaForCausalLM dir as ModelOpt's Hugging Face export in out_dir: the quantized weights, config.json
    (with its quantization_config) and hf_quant_config.json (quant_algo W4A16_AWQ or FP8), the format TensorRT-LLM's
    PyTorch flow loads (ENGINE=llmapi), plus the tokenizer's files, so that the folder is LLM(model=...)'s whole
    input as TensorRT-LLM's examples/quantization/quantize.py leaves it. The same calibration as the engine flow's
    (calibrated_model); the unquantized tensors in the checkpoint's 16-bit dtype (export_dtype: float16 for a
    float32 checkpoint such as the tiny default)."""
    import shutil

    import torch
    from modelopt.torch.export import export_hf_checkpoint

    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    if algorithm not in MODELOPT_ALGORITHMS:
        raise QuantizationError(f"quantization {algorithm!r} is none of {sorted(MODELOPT_ALGORITHMS)}")
    hf_config = check_hf_checkpoint(hf_dir, group_size if algorithm == "awq" else 1)
    dtype = getattr(torch, export_dtype(hf_config))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = calib_texts if calib_texts is not None else read_calibration_texts()
    model = calibrated_model(hf_dir, texts, device, algorithm, group_size=group_size, kv_cache_dtype=kv_cache_dtype)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    start = time.perf_counter()
    # modelopt 0.37's export_hf_checkpoint writes the unquantized tensors in the model's own dtype whatever its dtype
    # argument says (seen with the float32 tiny model): cast first.
    export_hf_checkpoint(model.to(dtype), dtype=dtype, export_dir=out_dir)
    quant = json.loads((out_dir / HF_QUANT_CONFIG).read_text())["quantization"]
    if quant.get("quant_algo") != MODELOPT_ALGORITHMS[algorithm]:
        raise QuantizationError(f"{out_dir / HF_QUANT_CONFIG} says quant_algo {quant.get('quant_algo')!r}, not "
                                f"{MODELOPT_ALGORITHMS[algorithm]!r}")
    exported = json.loads((out_dir / "config.json").read_text())
    if float(exported.get("rope_theta", 0)) != float(hf_config["rope_theta"]):
        raise QuantizationError(f"exported rope_theta {exported.get('rope_theta')} differs from the checkpoint's "
                                f"{hf_config['rope_theta']}")
    for name in TOKENIZER_FILES:
        if (hf_dir / name).is_file() and not (out_dir / name).exists():
            shutil.copy2(hf_dir / name, out_dir / name)
    _log(f"exported {out_dir} ({quant['quant_algo']}) in {time.perf_counter() - start:.1f} s")
    return out_dir
