"""The benchmark's relay in front of the synthetic embedded engine (tools/soak.py; tools/bench.py --engine python):
installed into a built repository, it makes each engine model (`tensorrt_llm`, and `tensorrt_llm_draft` where there
is one) the relay (relay/, the library the repository's BLS relay already has; config.pbtxt here), and moves the
embedded engine behind it as `<name>_python`, whose model.py (model.py here) sends its responses to the relay as
frames: they leave tritonserver from C++, a step's back to back, as TensorRT-LLM's C++ backend sends them (from
Python each costs the stub's send: a step's responses trickle out over ms). Clients see the engine's contract
unchanged (tests/integration/test_engine_relay.py). Bench-only: nothing in the product knows of it.

Why not the C++ bench engine (tools/bench_engine) everywhere: the soak needs what only the embedded engine does
(a draft model for its speculative requests, the engine's refusals, its embedded_engine_* gauges, which the soak
reads to find sequences left behind)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from bls.artifact import MANIFEST, file_checksums
from bls.contract import BLS_MODEL, DRAFT_MODEL, TARGET_MODEL
from engine_build.render import render_model_config
from engine_build.repository import RELAY_LIBRARY, RepositoryError, read_manifest
from testkit.processes import ENGINE_RELAY_THREAD

SOURCE_DIR = Path(__file__).resolve().parent
RELAY_CONFIG = SOURCE_DIR / "config.pbtxt"  # beside tools/bench_models/, not in it: that folder is served whole
RELAYED_MODEL = SOURCE_DIR / "model.py"
EMBEDDED_MODEL = "embedded_model.py"  # the product's model.py, under the name RELAYED_MODEL imports it by
PYTHON_SUFFIX = "_python"  # the embedded engine behind the relay: `<engine model>_python`


def install(repo: Path) -> Path:
    """Put the relay in front of each embedded engine model of a built synthetic streaming repository; the
    repository's manifest is brought up to date (its models verify their files against it)."""
    repo = Path(repo).resolve()
    manifest = read_manifest(repo)
    library = repo / BLS_MODEL / "1" / RELAY_LIBRARY  # a streaming repository's relay, compiled by `make repo`
    if not (manifest.get("engine") == "embedded" and manifest.get("synthetic") and manifest.get("decoupled")
            and library.is_file()) or manifest.get("engine_relay"):
        raise RepositoryError(f"{repo}: engine_relay is for the synthetic benchmark engine only, in a streaming "
                              "repository (whose relay it reuses), once")
    for name in (TARGET_MODEL, DRAFT_MODEL):
        if (repo / name).is_dir():
            _install_relay(repo, name, library, manifest["triton_max_batch_size"])
    manifest |= {"engine_relay": True, "files": file_checksums(repo)}
    (repo / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return repo


def _install_relay(repo: Path, name: str, library: Path, max_batch_size: int) -> None:
    python_name = name + PYTHON_SUFFIX
    engine = repo / python_name
    (repo / name).rename(engine)
    config = engine / "config.pbtxt"
    text, renamed = re.subn(rf'^name: "{name}"$', f'name: "{python_name}"', config.read_text(), flags=re.MULTILINE)
    if renamed != 1:
        raise RepositoryError(f"{config}: expected one line `name: \"{name}\"`, found {renamed}")
    config.write_text(text)
    (engine / "1" / "model.py").rename(engine / "1" / EMBEDDED_MODEL)
    shutil.copy2(RELAYED_MODEL, engine / "1" / "model.py")
    relay = repo / name
    (relay / "1").mkdir(parents=True)
    shutil.copy2(library, relay / "1" / RELAY_LIBRARY)
    (relay / "config.pbtxt").write_text(render_model_config(RELAY_CONFIG, {
        "model_name": name,
        "triton_max_batch_size": max_batch_size,
        "python_model_name": python_name,
        "engine_models": "",  # the engine behind it calls no model
        "thread_name": ENGINE_RELAY_THREAD,
    }, contract_name=TARGET_MODEL))
