"""Assemble a servable Triton model repository from the templates in model_repository/.

The output directory gets every model's `1/` files, its rendered and validated config.pbtxt, and the
engine: the TensorRT-LLM engine files (ENGINE=trtllm) or the checkpoint the embedded engine serves,
both under `tensorrt_llm/1/` (and `tensorrt_llm_draft/1/` for the draft). A `repository.json` at the top
records what was built; Triton ignores top-level files.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from bls.artifact import MANIFEST, file_checksums
from bls.contract import TOKEN_TEXT_CLASSES_FILE
from embedded_engine.lora import LoraLayout
from embedded_engine.peft_lora import AdapterError, ConvertedAdapter, complete_modules
from embedded_engine.settings import DEFAULT_MAX_ACTIVE_REQUESTS, DEFAULT_MAX_QUEUED_REQUESTS
from embedded_engine.xgrammar_info import write_xgrammar_tokenizer_info
from engine_build.lora import (
    PREFETCH_DIR,
    adapter_record,
    adapter_table,
    convert_lora_dir,
    lora_cache_bytes,
    write_prefetch_dir,
)
from engine_build.render import render_model_config
from engine_build.token_text_classes import write_token_text_classes
from engine_build.topology import (
    BLS_MODEL,
    BLS_PYTHON_MODEL,
    DRAFT_MODEL,
    HANDOFF_MODEL,
    LLMAPI_TEMPLATE,
    TARGET_MODEL,
    Topology,
    repository_topology,
)
from engine_build.trtllm_config import (
    FIXED_PARAMETERS,
    XGRAMMAR_TOKENIZER_INFO,
    GuidedDecoding,
    engine_parameter_values,
    guided_decoding_values,
)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = PROJECT_ROOT / "model_repository"
# Distributions whose versions the manifest records (what the models and the build depend on).
BUILT_WITH = ("llama3-triton", "transformers", "tokenizers", "numpy", "torch", "nvidia-modelopt", "tensorrt_llm")
# Paths in the rendered configs are relative to the model's version folder (`<model>/1/`), where the Python
# models resolve them: no config holds a path of the build machine.
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_DIR = "checkpoint"
# What a tokenizer directory (an HF checkpoint's, or build/assets/tokenizer) contributes: never the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "tokenizer.model")
RELAY_DIR = PROJECT_ROOT / "relay"  # the relay's sources (relay/relay.h says which file does what)
# tensorrt_llm_bls as the relay, in front of the Python BLS (whose template is the folder's config.pbtxt).
RELAY_CONFIG = TEMPLATES / BLS_MODEL / "relay.config.pbtxt"
# The ensemble's engine step in a streaming repository (engine_build/topology.py): the relay library's second role.
HANDOFF_CONFIG = TEMPLATES / HANDOFF_MODEL / "config.pbtxt"
# Triton's own headers of the oldest server we serve (relay/include/README.md), where the container's are not here.
RELAY_VENDORED_INCLUDE = RELAY_DIR / "include"
CONTAINER_INCLUDE = Path("/opt/tritonserver/include")
RELAY_LIBRARY = "libtriton_llama3_relay.so"  # Triton finds a model's backend library in its version folder

EngineKind = Literal["embedded", "trtllm", "llmapi"]
LLMAPI_DRAFT_DIR = "draft"  # tensorrt_llm/1/draft: the EAGLE-3 head or the draft model of speculative_config


def default_bls_instance_count(relayed: bool, cpus: int | None = None) -> int:
    """Relayed: one BLS instance is one Python process serving many requests on threads; its per-token Python
    work caps what it streams, however many threads serve its requests, but every process also costs CPU per
    token of its own (wake-ups, round trips with cold caches), more the fewer tokens it streams: one instance
    per 4 cores of the building host (the GPU host for ENGINE=trtllm), 1 to 8 (docs/benchmarks.md has the runs).
    In-process: an instance serves one request at a time (bls.transports), so the instances are the
    concurrency: one per core, 4 to 32."""
    cpus = cpus or len(os.sched_getaffinity(0))
    if relayed:
        return max(1, min(8, cpus // 4))
    return max(4, min(32, cpus))


def default_preprocessing_instance_count(cpus: int | None = None) -> int:
    """preprocessing runs once per request (tokenizing the prompt and the word lists): its instances bound how many
    prompts of a burst of arrivals are tokenized at once. One per 4 cores of the building host, 1 to 8."""
    cpus = cpus or len(os.sched_getaffinity(0))
    return max(1, min(8, cpus // 4))


def default_postprocessing_instance_count(cpus: int | None = None) -> int:
    """postprocessing runs once per engine response (every streamed token of every stream, in the ensemble); an
    instance serves one batch at a time (tritonserver's thread for it prepares the batch, waits for the Python
    process, then passes each response on through the ensemble), so its instances cap the ensemble's tokens per
    second. One per 2 cores of the building host, 1 to 16: on 16 cores, 8 streamed 1.2-1.3x what 4 did once the
    handoff took the ensemble's scheduling off the engine's thread (docs/benchmarks.md)."""
    cpus = cpus or len(os.sched_getaffinity(0))
    return max(1, min(16, cpus // 2))


def default_handoff_sender_threads(cpus: int | None = None) -> int:
    """The handoff's sender threads (relay/handoff.h): each runs Triton's ensemble scheduling of the engine responses
    of the streams it serves, 65-85 µs a token all senders together on the 16-core host (docs/benchmarks.md). One per
    4 cores of the building host, 1 to 8: every streaming repository has a handoff, so the wiring CI tests is the one
    a GPU host serves (only the thread count scales)."""
    cpus = cpus or len(os.sched_getaffinity(0))
    return max(1, min(8, cpus // 4))


@dataclass(frozen=True)
class RepositorySettings:
    engine: EngineKind
    tokenizer_dir: Path
    target: Path  # checkpoint dir (embedded) or engine dir (trtllm)
    draft: Path | None = None
    triton_max_batch_size: int = 64
    max_input_len: int = 3072
    max_seq_len: int = 4096
    max_draft_len: int = 8
    max_queue_delay_microseconds: int = 0
    # Requests waiting in Triton's queue of preprocessing and the engine; one more is refused at
    # once with UNAVAILABLE (HTTP 503) instead of queueing without bound.
    max_queue_size: int = 256
    preprocessing_instance_count: int = field(default_factory=lambda: default_preprocessing_instance_count())
    postprocessing_instance_count: int = field(default_factory=lambda: default_postprocessing_instance_count())
    # Streaming repositories: the ensemble reaches the engine through the handoff with this many sender threads.
    handoff_sender_threads: int = field(default_factory=lambda: default_handoff_sender_threads())
    # How long a streamed token may wait in postprocessing's queue for others to batch with (its config says why).
    postprocessing_max_queue_delay_microseconds: int = 1000
    bls_instance_count: int | None = None  # None: default_bls_instance_count for the repository's transport
    # Relayed: requests one instance serves at once, and how many more may wait (one more is refused at once with
    # UNAVAILABLE). In-process: requests waiting in Triton's queue of the BLS (each instance serves one at a time).
    bls_max_concurrent_requests: int = 256  # per instance
    bls_max_queued_requests: int = 256  # per instance
    # Whether the prompt is echoed to a request that does not say: the engines' parameter, which the ensemble
    # and the BLS follow as upstream's do. True as NVIDIA's Llama guide sets it (and as Triton's OpenAI frontend,
    # which never sends it, needs); false (the backend's own default) for token-level clients that read the
    # prompt back in output_ids, such as NVIDIA's client-side speculative decoding client.
    exclude_input_in_output: bool = True
    skip_special_tokens: bool = True
    add_special_tokens: bool = True
    query_special_tokens: str = "text"
    accumulate_tokens: bool = False
    # tensorrt_llm_bls: new tokens per streamed response after the first (TensorRT-LLM's LlmArgs.stream_interval,
    # vLLM's and SGLang's --stream-interval): 1 streams every token; more trade smoothness for BLS CPU per token.
    stream_interval: int = 1
    # Triton's decoupled transaction policy for the engines and the BLS (upstream's decoupled_mode): false
    # serves clients that use unary RPCs (no streaming), e.g. inflight_batcher_llm_client.py without
    # --streaming and e2e_grpc_speculative_decoding_client.py.
    decoupled: bool = True
    synthetic: bool = False
    # Embedded engine: merge streamed tokens that wait for sending into one response (never on a GPU).
    merge_streamed_tokens: bool = False
    step_ms: float = 0.0  # embedded engine: minimum duration of an engine iteration (a GPU-like step)
    engine_instance_count: int = 1  # > 1 only with synthetic (benchmark stand-ins): see embedded.config.pbtxt
    torch_threads: int = 0  # 0: torch's default
    max_active_requests: int = DEFAULT_MAX_ACTIVE_REQUESTS
    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS
    # KV cache share of free GPU memory (trtllm). Target and draft share the GPU and either may load first,
    # so the two fractions stay well under 1 together.
    # The TensorRT-LLM engine's backend parameters (ENGINE=trtllm); engine_build/gpu_plan.py says where each
    # default comes from, and the profile of `make repo` sets them.
    world_size: int = 1  # TP x PP of the engines
    batch_scheduler_policy: str = "guaranteed_no_evict"
    enable_chunked_context: bool = True
    enable_kv_cache_reuse: bool = True
    target_kv_cache_fraction: float = 0.9
    target_kv_cache_fraction_with_draft: float = 0.7
    draft_kv_cache_fraction: float = 0.9
    draft_max_kv_tokens: int | None = None  # the draft's cache, capped to the target's token capacity
    # Where the repository will be served, for the C++ backend's gpt_model_path (it opens the path as given);
    # None: where it is built. `python -m engine_build relocate` changes it after a move.
    serve_path: Path | None = None
    engines_built: bool = True  # false: a dry run rendered the configs, the engine folders are empty
    # ENGINE=trtllm: xgrammar configures the C++ backend's guided decoding (the tokenizer info file beside the
    # engine); none leaves its three keys unset, as upstream's template does.
    guided_decoding: GuidedDecoding = "xgrammar"
    plan: dict | None = None  # the engine plan and capacity check of `make repo ENGINE=trtllm`, for the record
    # ENGINE=llmapi: which LLM the tensorrt_llm model runs (tensorrt_llm: TensorRT-LLM's; stand_in: the embedded engine
    # behind the LLM API's surface), model.yaml's LLM() arguments (paths relative to tensorrt_llm/1/), and the folder
    # of speculative_config's model (EAGLE-3 head or draft), linked into tensorrt_llm/1/draft.
    llm: str | None = None
    llm_args: dict | None = None
    speculative_model: Path | None = None
    # LoRA (engine_build/lora.py): one PEFT adapter per subfolder of lora_dir, checked against lora_base's config
    # (default: the target checkpoint's; ENGINE=trtllm: the HF checkpoint) and converted into the target engine's
    # prefetch folder; the engine takes ranks up to max_lora_rank (trtllm-build's --max_lora_rank default).
    lora_dir: Path | None = None
    lora_base: Path | None = None
    max_lora_rank: int = 64


class RepositoryError(RuntimeError):
    pass


def assemble_repository(out: Path, settings: RepositorySettings) -> Path:
    out = out.resolve()
    _prepare_output_dir(out, settings)
    topology = repository_topology(settings)
    relayed = topology.relayed
    if relayed:
        _require_compiler()
    if settings.bls_instance_count is None:
        settings = replace(settings, bls_instance_count=default_bls_instance_count(relayed))
    engine_models = [TARGET_MODEL] + ([DRAFT_MODEL] if settings.draft else [])
    adapters = _convert_adapters(settings)
    common = {
        "triton_max_batch_size": settings.triton_max_batch_size,
        "max_queue_delay_microseconds": settings.max_queue_delay_microseconds,
    }

    _write_model(out, "preprocessing", tokenizer=settings.tokenizer_dir, values={
        **common,
        "max_queue_size": settings.max_queue_size,
        "preprocessing_instance_count": settings.preprocessing_instance_count,
        "tokenizer_dir": TOKENIZER_DIR,
        "add_special_tokens": settings.add_special_tokens,
        "query_special_tokens": settings.query_special_tokens,
        "max_input_len": settings.max_input_len,
        "lora_adapters": adapter_table(adapters),
    })
    _write_model(out, "postprocessing", tokenizer=settings.tokenizer_dir, values={
        "triton_max_batch_size": settings.triton_max_batch_size,
        "postprocessing_max_queue_delay_microseconds": settings.postprocessing_max_queue_delay_microseconds,
        "postprocessing_instance_count": settings.postprocessing_instance_count,
        "tokenizer_dir": TOKENIZER_DIR,
        "skip_special_tokens": settings.skip_special_tokens,
    })
    _write_model(out, "ensemble", vendored=(), values={
        "triton_max_batch_size": settings.triton_max_batch_size,
        # Streaming: through the handoff (relay/handoff.h says why).
        "tensorrt_llm_model_name": topology.ensemble_engine_step,
    })
    _write_model(out, BLS_PYTHON_MODEL if relayed else BLS_MODEL, source_name=BLS_MODEL,
                 contract_name=BLS_MODEL, tokenizer=settings.tokenizer_dir, values={
        "model_name": BLS_PYTHON_MODEL if relayed else BLS_MODEL,
        "triton_max_batch_size": settings.triton_max_batch_size,
        "bls_instance_count": settings.bls_instance_count,
        "tokenizer_dir": TOKENIZER_DIR,
        "skip_special_tokens": settings.skip_special_tokens,
        "accumulate_tokens": settings.accumulate_tokens,
        "exclude_input_in_output": settings.exclude_input_in_output,
        "stream_interval": settings.stream_interval,
        "tensorrt_llm_model_name": TARGET_MODEL,
        "tensorrt_llm_draft_model_name": DRAFT_MODEL if settings.draft else "",
        "max_draft_len": settings.max_draft_len if settings.draft else 0,
        "decoupled_mode": settings.decoupled,
        "transport": topology.bls_transport,
        "admission": _bls_admission(settings, relayed),
    })
    if relayed:
        relay = _write_model(out, BLS_MODEL, vendored=(), version_files=False, template=RELAY_CONFIG, values={
            "triton_max_batch_size": settings.triton_max_batch_size,
            "python_model_name": BLS_PYTHON_MODEL,
            "engine_models": ",".join(engine_models),  # the only models its engine calls may name
        })
        relay_library = relay / "1" / RELAY_LIBRARY  # compiled once; every relay-backend model gets a copy
        compile_relay(relay_library)
        handoff_dir = _write_model(out, HANDOFF_MODEL, vendored=(), version_files=False, template=HANDOFF_CONFIG,
                                   contract_name=HANDOFF_MODEL, values={
            "model_name": HANDOFF_MODEL,
            "triton_max_batch_size": settings.triton_max_batch_size,
            "handoff_to": TARGET_MODEL,
            "sender_threads": settings.handoff_sender_threads,
        })
        shutil.copy2(relay_library, handoff_dir / "1" / RELAY_LIBRARY)  # one library, each model's role in its config
        # What the handoff tells the responses that need the stream state by (relay/handoff.h).
        write_token_text_classes(out / "postprocessing" / "1" / TOKENIZER_DIR, settings.skip_special_tokens,
                                 handoff_dir / "1" / TOKEN_TEXT_CLASSES_FILE)
    if settings.engine == "llmapi":
        _write_llmapi_model(out, settings, adapters)
    else:
        for name in engine_models:
            source = settings.target if name == TARGET_MODEL else settings.draft
            _write_engine_model(out, name, source, settings, adapters if name == TARGET_MODEL else [])

    _write_manifest(out, settings, adapters, topology)
    return out


def _convert_adapters(settings: RepositorySettings) -> list[ConvertedAdapter]:
    """The adapters of settings.lora_dir in the backend's format, checked against the base (engine_build/lora.py)."""
    if settings.lora_dir is None:
        return []
    if settings.synthetic:
        raise RepositoryError("LORA_DIR needs a model: the synthetic benchmark engine has none")
    from engine_build.lora import base_llama_config

    try:
        adapters = convert_lora_dir(settings.lora_dir, base_llama_config(settings.lora_base or settings.target),
                                    settings.max_lora_rank)
    except AdapterError as error:
        raise RepositoryError(f"LORA_DIR {settings.lora_dir}: {error}") from None
    print("[repo] LoRA adapters for tensorrt_llm/1/lora (task id: name, rank, modules): " + "; ".join(
        f"{a.task_id}: {a.name}, r={a.rank}, {' '.join(a.modules)}" for a in adapters), flush=True)
    return adapters


def _bls_admission(settings: RepositorySettings, relayed: bool) -> str:
    """How many requests the BLS takes (config text). Relayed: its own pool (bls.relay.admission); a decoupled
    model's requests leave Triton's queue as soon as `execute` returns. In-process: Triton's queue, one request
    per `execute` (preferred_batch_size 1: an instance serves one request at a time, a batch would wait behind
    its first request), the rest refused once max_queue_size wait."""
    if relayed:
        return (f'parameters {{ key: "max_concurrent_requests" value: {{ string_value: '
                f'"{settings.bls_max_concurrent_requests}" }} }}\n'
                f'parameters {{ key: "max_queued_requests" value: {{ string_value: '
                f'"{settings.bls_max_queued_requests}" }} }}')
    return ("dynamic_batching {\n  preferred_batch_size: [ 1 ]\n  max_queue_delay_microseconds: 0\n"
            f"  default_queue_policy {{ max_queue_size: {settings.bls_max_queued_requests} }}\n}}")


def _require_compiler() -> None:
    """A streaming repository's tensorrt_llm_bls and handoff are the relay (relay/), compiled here: stop, naming what
    to install, where no C++ compiler is."""
    if not can_compile_relay():
        raise RepositoryError(
            f"a streaming repository (DECOUPLED=true) needs a C++ compiler to build its relay ({RELAY_DIR.name}/): "
            f"{_compiler()} not found; install one (apt-get install g++, or clang; CXX=... names another), or build "
            "a unary repository with DECOUPLED=false (no relay, no streaming)")


# The C++ compilers the relay builds with, in order: g++ where there is one, clang++ otherwise (the 26.07 image's
# runtime stage installs clang, not g++: tensorrtllm_backend r26.07 dockerfile/Dockerfile.triton.trt_llm_backend).
CXX_COMPILERS = ("g++", "clang++")


def _compiler() -> str:
    """$CXX if set, else the first of CXX_COMPILERS on PATH (named even when absent, for messages)."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((name for name in CXX_COMPILERS if shutil.which(name)), " or ".join(CXX_COMPILERS))


def can_compile_relay() -> bool:
    """Whether this machine can build the relay (a C++ compiler: CXX, g++ or clang++, on PATH)."""
    return shutil.which(_compiler()) is not None


def relay_include_dir() -> Path:
    """Triton's headers to compile against: the container's, where it has them (the server the repository will be
    served by), else the vendored ones of Triton 2.51 (relay/include/README.md)."""
    if (CONTAINER_INCLUDE / "triton" / "core" / "tritonbackend.h").is_file():
        return CONTAINER_INCLUDE
    return RELAY_VENDORED_INCLUDE


def relay_sources() -> list[Path]:
    """The relay library's C++ files (its tests, relay/tests/, apart)."""
    return sorted(RELAY_DIR.glob("*.cc"))


# Every build of relay/ (the library, its tests, `make lint`): a warning fails it, as Triton's backend examples build
# (triton-inference-server/backend examples/backends/recommended/CMakeLists.txt: -Wall -Wextra -Werror).
RELAY_WARNINGS = ("-Wall", "-Wextra", "-Werror")


# Exports Triton's entry points (TRITONBACKEND_*) only: every backend library we build links with it.
BACKEND_VERSION_SCRIPT = RELAY_DIR / "libtriton_llama3_relay.ldscript"


def backend_compile_command(library: Path, sources: list[Path]) -> list[str]:
    """A Triton backend library from `sources`, against Triton's official headers (relay_include_dir); tritonserver
    provides the C API's symbols when it loads the library. libstdc++ and libgcc are linked in, so that a repository
    built on one Linux loads in the 26.07 container (Ubuntu 24.04) whatever its libstdc++; the version script exports
    Triton's entry points only, as Triton's backend examples do. The relay's build, and the bench engine's
    (tools/bench_engine)."""
    return [_compiler(), "-O2", "-std=c++17", *RELAY_WARNINGS, "-shared", "-fPIC", "-static-libstdc++",
            "-static-libgcc", f"-Wl,--version-script={BACKEND_VERSION_SCRIPT}",
            f"-I{relay_include_dir()}", "-o", str(library), *map(str, sources), "-lpthread"]


def relay_compile_command(library: Path) -> list[str]:
    """relay/*.cc into `library` (backend_compile_command)."""
    return backend_compile_command(library, relay_sources())


def compile_relay(library: Path) -> None:
    """The relay library (relay_compile_command), or RepositoryError with the compiler's messages."""
    command = relay_compile_command(library)
    print(f"[repo] compiling the relay: {' '.join(command)}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RepositoryError(f"compiling the relay (relay/) failed (exit {result.returncode}):\n{result.stderr}")


def _write_manifest(out: Path, settings: RepositorySettings, adapters: list[ConvertedAdapter],
                    topology: Topology) -> None:
    """repository.json: the build settings (source paths on the build machine, for the record only: no config
    uses them), the versions it was built with, the models, the LoRA adapters (names, task ids, ranks, their prefetch
    folders relative to the engine's version folder), and a SHA-256 per file the models verify."""
    manifest = {key: (str(v.resolve()) if isinstance(v, Path) else v) for key, v in asdict(settings).items()}
    manifest["lora_adapters"] = [adapter_record(adapter) for adapter in adapters]
    manifest["topology"] = topology.record(settings)
    manifest["models"] = sorted(p.name for p in out.iterdir() if p.is_dir())
    manifest["versions"] = {name: _version(name) for name in BUILT_WITH}
    manifest["files"] = file_checksums(out)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _prepare_output_dir(out: Path, settings: RepositorySettings) -> None:
    if out.exists():
        if any(out.iterdir()) and not (out / MANIFEST).is_file():
            raise RepositoryError(f"{out} exists and was not built by this tool; refusing to overwrite it")
        brings_engines = settings.engine == "trtllm" and any(Path(settings.target).glob("rank*.engine"))
        if not brings_engines and any((out / TARGET_MODEL / "1").glob("rank*.engine")):
            # `make serve` (the embedded default) or a dry run over a GPU repository would delete its engines.
            raise RepositoryError(
                f"{out} holds TensorRT-LLM engines; refusing to replace it with a repository without any: serve it "
                f"with `make serve-only REPO={out}`, or build elsewhere with REPO=")
        shutil.rmtree(out)
    out.mkdir(parents=True)


def _write_model(out: Path, name: str, values: dict, template: Path | None = None,
                 source_name: str | None = None, vendored: tuple[str, ...] = ("bls",),
                 tokenizer: Path | None = None, contract_name: str | None = None, version_files: bool = True) -> Path:
    """A model folder: its `1/` files (an empty `1/` without version_files), the library packages it imports and
    its tokenizer files copied in beside them (so the repository serves without this checkout), and its rendered,
    validated config."""
    source = TEMPLATES / (source_name or name)
    target = out / name
    ignore = shutil.ignore_patterns("__pycache__")
    if version_files:
        # .gitkeep included: an empty version folder (the ensemble's) is lost in an object store, which holds files
        # only, and Triton then finds no version to load (NVIDIA's ensemble ships ensemble/1/.tmp for the same reason).
        shutil.copytree(source / "1", target / "1", ignore=ignore)
    else:
        (target / "1").mkdir(parents=True)
    for package in vendored:
        shutil.copytree(PROJECT_ROOT / package, target / "1" / package, ignore=ignore)
    if tokenizer is not None:
        _copy_tokenizer(tokenizer, target / "1" / TOKENIZER_DIR)
    config = render_model_config(template or source / "config.pbtxt", values,
                                 contract_name=contract_name or source_name or name)
    (target / "config.pbtxt").write_text(config)
    return target


def _write_engine_model(out: Path, name: str, source: Path, settings: RepositorySettings,
                        adapters: list[ConvertedAdapter]) -> None:
    """`adapters`: the LoRA adapters this engine serves, written to its prefetch folder."""
    is_draft = name == DRAFT_MODEL
    common = {
        "model_name": name,
        "triton_max_batch_size": settings.triton_max_batch_size,
        "decoupled_mode": settings.decoupled,
        "max_queue_delay_microseconds": settings.max_queue_delay_microseconds,
        "max_queue_size": settings.max_queue_size,
    }
    if settings.engine == "embedded":
        if settings.engine_instance_count > 1 and not settings.synthetic:
            raise RepositoryError("engine_instance_count > 1 is for the synthetic benchmark engine only: a `stop` "
                                  "(cancellation) must reach the instance that holds the sequence")
        target = _write_model(out, name, vendored=("bls", "embedded_engine"), values={
            **common,
            "model_name": name,
            "checkpoint_dir": CHECKPOINT_DIR,
            "max_seq_len": settings.max_seq_len,
            "max_draft_len": 0 if is_draft or not settings.draft else settings.max_draft_len,
            "max_active_requests": settings.max_active_requests,
            "max_queued_requests": settings.max_queued_requests,
            "exclude_input_in_output": settings.exclude_input_in_output,
            "guided_decoding_backend": "xgrammar",
            "xgrammar_tokenizer_info_path": XGRAMMAR_TOKENIZER_INFO,
            "synthetic": settings.synthetic,
            "merge_streamed_tokens": settings.merge_streamed_tokens,
            "step_ms": settings.step_ms,
            "engine_instance_count": settings.engine_instance_count,
            "torch_threads": settings.torch_threads,
            **_embedded_lora_values(adapters, settings.max_lora_rank),
        }, template=TEMPLATES / TARGET_MODEL / "embedded.config.pbtxt", source_name=TARGET_MODEL)
        _link_tree(source, target / "1" / CHECKPOINT_DIR)
        write_prefetch_dir(adapters, target / "1" / PREFETCH_DIR)
        write_xgrammar_tokenizer_info(settings.tokenizer_dir, target / "1" / XGRAMMAR_TOKENIZER_INFO)
        return

    if is_draft:
        fraction = settings.draft_kv_cache_fraction
    else:
        fraction = settings.target_kv_cache_fraction_with_draft if settings.draft else settings.target_kv_cache_fraction
    version_dir = out / name / "1"
    version_dir.mkdir(parents=True)
    # The C++ backend opens its paths as given: absolute, where the repository will be served.
    served_version_dir = (settings.serve_path or out) / name / "1"
    parameters = {
        **FIXED_PARAMETERS,
        "engine_dir": str(served_version_dir),
        "batch_scheduler_policy": settings.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": fraction,
        # Draft-target speculative decoding needs KV cache reuse on both models.
        "enable_kv_cache_reuse": settings.enable_kv_cache_reuse or settings.draft is not None,
        "enable_chunked_context": settings.enable_chunked_context,
        "exclude_input_in_output": settings.exclude_input_in_output,
        **guided_decoding_values(settings.guided_decoding, served_version_dir),
        **_trtllm_lora_values(adapters, settings.max_lora_rank, served_version_dir),
    }
    if settings.draft:  # orchestrator mode: both models' ranks on GPUs 0..world_size-1 (same TP x PP)
        parameters["gpu_device_ids"] = ",".join(str(gpu) for gpu in range(settings.world_size))
    if is_draft and settings.draft_max_kv_tokens:
        parameters["max_tokens_in_paged_kv_cache"] = settings.draft_max_kv_tokens
    if settings.guided_decoding == "xgrammar":
        write_xgrammar_tokenizer_info(settings.tokenizer_dir, version_dir / XGRAMMAR_TOKENIZER_INFO)
    write_prefetch_dir(adapters, version_dir / PREFETCH_DIR)
    config = render_model_config(TEMPLATES / TARGET_MODEL / "config.pbtxt",
                                 {**common, **engine_parameter_values(parameters)}, contract_name=TARGET_MODEL)
    (out / name / "config.pbtxt").write_text(config)
    if settings.engines_built:
        from engine_build.trtllm import copy_engine

        copy_engine(source, version_dir)


def _write_llmapi_model(out: Path, settings: RepositorySettings, adapters: list[ConvertedAdapter]) -> None:
    """tensorrt_llm on the LLM API: the template folder's model with the packages it imports, its config (the
    parameter `llm` says which LLM it runs), the checkpoint (and speculative model) linked into its version folder,
    the LoRA adapters' PEFT folders where model.yaml's lora_config names them (checked against the base by
    _convert_adapters), and model.yaml, whose triton_config repeats the config's batch size and transaction policy
    (NVIDIA's launch_triton_server.py disables auto-complete, so config.pbtxt is what Triton applies)."""
    from engine_build.llmapi_yaml import (
        CANCELLATION_CHECK_PERIOD_MS,
        LLM_STAND_IN,
        LLM_TENSORRT_LLM,
        MODEL_YAML,
        VERSION_DIR_NOTE,
        model_yaml_text,
    )

    if settings.llm not in (LLM_TENSORRT_LLM, LLM_STAND_IN) or settings.llm_args is None:
        raise RepositoryError(f"ENGINE=llmapi needs llm ({LLM_TENSORRT_LLM} or {LLM_STAND_IN}) and its LLM() "
                              f"arguments; got llm={settings.llm!r}")
    template = TEMPLATES / LLMAPI_TEMPLATE
    if not (template / "config.pbtxt").is_file() or not (template / "1" / "model.py").is_file():
        raise RepositoryError(f"{template} (config.pbtxt and 1/model.py: the tensorrt_llm model on the LLM API) is "
                              "missing from this checkout")
    # embedded_engine whatever the LLM: the model's own code imports it (the contract's response shapes, the C++
    # backend's metric families, guide parsing), not only the stand-in.
    vendored = ("bls", "embedded_engine", "llmapi_engine")
    # Its tensors: bls/contract.py's contract of the template's name (the C++ backend's, plus NVIDIA's llmapi names).
    target = _write_model(out, TARGET_MODEL, source_name=LLMAPI_TEMPLATE, contract_name=LLMAPI_TEMPLATE,
                          vendored=vendored, values={
        "model_name": TARGET_MODEL,
        "triton_max_batch_size": settings.triton_max_batch_size,
        "decoupled_mode": settings.decoupled,
        "max_queue_delay_microseconds": settings.max_queue_delay_microseconds,
        "max_queue_size": settings.max_queue_size,
        "exclude_input_in_output": settings.exclude_input_in_output,
        "llm": settings.llm,
    })
    version_dir = target / "1"
    if settings.engines_built:
        _link_tree(Path(settings.target), version_dir / settings.llm_args["model"])
        if settings.speculative_model is not None:
            _link_tree(Path(settings.speculative_model), version_dir / LLMAPI_DRAFT_DIR)
    lora_dirs = (settings.llm_args.get("lora_config") or {}).get("lora_dir", [])
    if [Path(folder).name for folder in lora_dirs] != [adapter.name for adapter in adapters]:
        raise RepositoryError(f"model.yaml's lora_config.lora_dir {lora_dirs} is not LORA_DIR's adapters "
                              f"{[adapter.name for adapter in adapters]} in task-id order")
    for folder in lora_dirs:
        _link_files(Path(settings.lora_dir) / Path(folder).name, version_dir / folder)
    triton_config = {
        "max_batch_size": settings.triton_max_batch_size,
        "decoupled": settings.decoupled,
        "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
    }
    (version_dir / MODEL_YAML).write_text(model_yaml_text(settings.llm_args, triton_config, VERSION_DIR_NOTE))


def _embedded_lora_values(adapters: list[ConvertedAdapter], max_lora_rank: int) -> dict:
    """The embedded engine's LoRA parameters: what trtllm-build would be given (target modules, max rank) and the
    backend's cache keys; no adapters, no LoRA (empty target modules)."""
    modules = complete_modules({module for adapter in adapters for module in adapter.modules})
    return {
        "lora_target_modules": ",".join(modules),
        "max_lora_rank": max_lora_rank,
        # The engine holds fp32 copies (4 bytes a value).
        "lora_cache_host_memory_bytes": lora_cache_bytes(adapters, bytes_per_value=4),
        "lora_prefetch_dir": PREFETCH_DIR if adapters else "",
    }


def _trtllm_lora_values(adapters: list[ConvertedAdapter], max_lora_rank: int, served_version_dir: Path) -> dict:
    """The C++ backend's LoRA parameters (model_instance_state.cc getPeftCacheConfigFromParams), sized from the
    adapters: a cache page fits the largest adapter rank (optimal adapter size), the maximum is the engine's
    max_lora_rank (the backend clamps both to it), the host cache holds every prefetched adapter twice over, and the
    prefetch folder is absolute where the repository is served (the backend opens it as given). Without adapters all
    stay unset, as upstream's template leaves them."""
    if not adapters:
        return {}
    return {
        "lora_cache_optimal_adapter_size": max(adapter.rank for adapter in adapters),
        "lora_cache_max_adapter_size": max_lora_rank,
        "lora_cache_host_memory_bytes": lora_cache_bytes(adapters, bytes_per_value=2),
        "lora_prefetch_dir": str(served_version_dir / PREFETCH_DIR),
    }


def _copy_tokenizer(source: Path, dest: Path) -> None:
    files = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not any(f.name in ("tokenizer.json", "tokenizer.model") for f in files):
        raise RepositoryError(f"{source} holds no tokenizer (tokenizer.json or tokenizer.model expected)")
    dest.mkdir(parents=True)
    for file in files:
        _link_or_copy(file, dest / file.name)


def _link_or_copy(source: Path, dest: Path) -> None:
    """Hard links where possible (the same tokenizer in three models costs its size once)."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def _link_files(source: Path, dest: Path) -> None:
    """Hard-link a folder's files (a copy where links are not possible)."""
    dest.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file():
            _link_or_copy(item, dest / item.name)


def _link_tree(source: Path, dest: Path) -> None:
    """Hard-link a checkpoint into the repository (a copy where links are not possible)."""
    if not (source / "config.json").is_file():
        raise RepositoryError(f"{source} has no config.json: not a checkpoint")
    _link_files(source, dest)


def variant_repository(base: Path, out: Path, **overrides) -> Path:
    """A repository built like `base` (its manifest's settings), with RepositorySettings fields overridden."""
    manifest = read_manifest(base)
    settings = {f.name: manifest[f.name] for f in dataclasses.fields(RepositorySettings) if f.name in manifest}
    for key in ("tokenizer_dir", "target", "draft", "serve_path", "lora_dir", "lora_base", "speculative_model"):
        if settings.get(key) is not None:
            settings[key] = Path(settings[key])
    settings.update(overrides)
    return assemble_repository(out, RepositorySettings(**settings))


def repository_tokenizer(repo: Path) -> Path:
    """The tokenizer a built repository ships (the preprocessing model's copy)."""
    return Path(repo) / "preprocessing" / "1" / TOKENIZER_DIR


def read_manifest(repo: Path) -> dict:
    path = repo / MANIFEST
    if not path.is_file():
        raise RepositoryError(f"{repo} has no {MANIFEST}: build it with `make repo`")
    return json.loads(path.read_text())


def repository_layout(repo: Path) -> tuple[LoraLayout, dict[int, str]]:
    """What a built repository's engine takes (its dims, the modules and largest rank it was built for) and the task
    ids its own adapters hold: the layout an adapter added to the running deployment must fit."""
    from engine_build.lora import base_llama_config

    manifest = read_manifest(Path(repo))
    adapters = manifest.get("lora_adapters") or []
    if not adapters:
        raise AdapterError(f"{repo} was built without LORA_DIR: its engine takes no LoRA (rebuild it with one)")
    version_dir = Path(repo) / TARGET_MODEL / "1"
    base = version_dir / CHECKPOINT_DIR if (version_dir / CHECKPOINT_DIR).is_dir() else version_dir
    modules = complete_modules({module for adapter in adapters for module in adapter["target_modules"]})
    layout = LoraLayout.from_config(base_llama_config(base), modules, int(manifest["max_lora_rank"]))
    return layout, {adapter["task_id"]: adapter["name"] for adapter in adapters}
