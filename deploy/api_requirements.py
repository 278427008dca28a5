"""The OpenAI API image's pip requirements (deploy/api.Dockerfile), read from pyproject.toml: the `api` extra, plus
the pins of the core dependencies the API imports (API_CORE). pyproject.toml stays the one place a version is set.

Not `pip install ".[api]"`: that also installs every core dependency (transformers, tokenizers, safetensors, jinja2),
which only the Triton models use; the API never imports them, and the image would carry them for nothing.

    python api_requirements.py [pyproject.toml]      # one requirement a line, on stdout

Standard library only (tomllib: Python >= 3.11): it runs in the bare base image, before anything is installed.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# numpy: openai_api builds the request tensors with it. protobuf: tritonclient's gRPC stubs (tritonclient[grpc] 2.51
# takes any protobuf < 5; the core pin says which). Both come with tritonclient anyway: these pin them.
API_CORE = ("numpy", "protobuf")


def requirement_name(requirement: str) -> str:
    """PEP 503's normalized project name of a requirement string (`tritonclient[grpc]==2.51.0` -> tritonclient)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def api_requirements(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    core = {requirement_name(r): r for r in project["dependencies"]}
    missing = [name for name in API_CORE if name not in core]
    if missing:
        raise ValueError(f"{pyproject}: no core dependency {', '.join(missing)} (deploy/api_requirements.py API_CORE)")
    return [core[name] for name in API_CORE] + list(project["optional-dependencies"]["api"])


if __name__ == "__main__":
    print("\n".join(api_requirements(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
