"""The benchmark's C++ engine (engine.h says what it does): compiled by the bench, with the relay's flags
(engine_build.repository.backend_compile_command), into a built repository's `tensorrt_llm`, in place of the
embedded engine. Bench-only: the tests' stand-in stays the Python synthetic engine (embedded_engine/synthetic.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bls.artifact import MANIFEST, file_checksums
from embedded_engine.synthetic import TEXT_CYCLE
from engine_build.render import render_model_config
from engine_build.repository import TARGET_MODEL, backend_compile_command, read_manifest
from testkit.processes import BENCH_ENGINE_THREAD

SOURCE_DIR = Path(__file__).resolve().parent
LIBRARY = "libtriton_bench_engine.so"  # Triton finds a model's backend library in its version folder
THREAD_NAME = BENCH_ENGINE_THREAD  # the step thread, whose CPU the bench counts as the engine's


def compile_command(library: Path) -> list[str]:
    return backend_compile_command(library, sorted(SOURCE_DIR.glob("*.cc")))


def install(repo: Path, step_ms: float, max_active_requests: int, max_queued_requests: int,
            text_cycle: Sequence[int] = TEXT_CYCLE) -> Path:
    """Replace the built repository's `tensorrt_llm` (the synthetic embedded engine, not behind a relay) by the C++
    bench engine, generating `text_cycle` (the synthetic engine's text unless a test needs other tokens); the
    repository's manifest is brought up to date (its models verify their files against it)."""
    repo = Path(repo).resolve()
    manifest = read_manifest(repo)
    if not manifest.get("synthetic") or manifest.get("engine_relay") or manifest.get("draft"):
        raise ValueError(f"{repo}: the bench engine replaces a synthetic engine with no relay and no draft model")
    model = repo / TARGET_MODEL
    shutil.rmtree(model)
    (model / "1").mkdir(parents=True)
    command = compile_command(model / "1" / LIBRARY)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compiling the bench engine failed (exit {result.returncode}): {' '.join(command)}\n"
                           f"{result.stderr}")
    values = {
        "model_name": TARGET_MODEL,
        "triton_max_batch_size": manifest["triton_max_batch_size"],
        "max_queue_delay_microseconds": manifest["max_queue_delay_microseconds"],
        "max_queue_size": manifest["max_queue_size"],
        "step_ms": step_ms,
        "max_active_requests": max_active_requests,
        "max_queued_requests": max_queued_requests,
        "text_cycle": ",".join(map(str, text_cycle)),
        "thread_name": THREAD_NAME,
    }
    (model / "config.pbtxt").write_text(render_model_config(SOURCE_DIR / "config.pbtxt", values,
                                                            contract_name=TARGET_MODEL))
    manifest |= {"bench_engine": {"step_ms": step_ms, "max_active_requests": max_active_requests,
                                  "max_queued_requests": max_queued_requests},
                 "files": file_checksums(repo)}
    (repo / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return repo
