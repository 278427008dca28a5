"""The default assets `make repo` builds when no HF_MODEL is given: the real Llama 3 tokenizer (from llama-models) and
the tiny Llama-3-architecture target and draft models with their AWQ checkpoints, reused while their sources are
unchanged. Used by every flow's CPU build (engine_build/cli.py, engine_build/llmapi_flow.py)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

ASSET_SOURCES = ("assets/tokenizer.py", "assets/tiny_models.py", "quantize.py", "data/calibration.txt")


def stage(message: str) -> None:
    print(f"[engine_build {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _assets_fingerprint(seed: int) -> str:
    digest = hashlib.sha256(str(seed).encode())
    here = Path(__file__).parents[1]  # engine_build/
    for name in ASSET_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


def build_default_assets(assets: Path, seed: int = 0) -> dict[str, Path]:
    """Tokenizer, tiny target + draft (HF, fp32) and their AWQ checkpoints; reused while up to date."""
    from engine_build.assets.tiny_models import write_tiny_models
    from engine_build.assets.tokenizer import write_llama3_tokenizer
    from engine_build.quantize import quantize_awq

    paths = {
        "tokenizer": assets / "tokenizer",
        "target_hf": assets / "tiny-target-hf",
        "draft_hf": assets / "tiny-draft-hf",
        "target_awq": assets / "tiny-target-awq",
        "draft_awq": assets / "tiny-draft-awq",
    }
    stamp = assets / "assets.json"
    fingerprint = _assets_fingerprint(seed)
    if stamp.is_file() and json.loads(stamp.read_text()).get("fingerprint") == fingerprint:
        stage(f"default assets in {assets} are up to date")
        return paths
    stage("converting the Llama 3 tokenizer from llama-models")
    write_llama3_tokenizer(paths["tokenizer"])
    stage("writing the tiny Llama-3-architecture target and draft models")
    write_tiny_models(paths["target_hf"], paths["draft_hf"], paths["tokenizer"], seed=seed)
    for name in ("target", "draft"):
        stage(f"AWQ int4 quantization of the tiny {name} (nvidia-modelopt)")
        quantize_awq(paths[f"{name}_hf"], paths[f"{name}_awq"])
    stamp.write_text(json.dumps({"fingerprint": fingerprint, "seed": seed}) + "\n")
    return paths
