"""The repository is the artifact: a copy of it, moved away from the build, serves in a Python environment
that has the runtime dependencies but not this project, and passes the integration tests.

The environment: a fresh venv of the same interpreter whose site-packages point at this venv's packages
through a .pth line. Python reads .pth files only in its own site-packages, so the editable install of this
project (a .pth in the venv's) is not seen: `import bls` fails there, as in NVIDIA's container.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from serving.tritonserver import TritonServer

SUITE = ["tests/integration/test_text.py", "tests/integration/test_conformance.py"]
ROOT = Path(__file__).resolve().parents[2]


def runtime_python(root: Path) -> Path:
    """A venv with this venv's third-party packages and without this project."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (root / "lib" / version / "site-packages" / "runtime-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root / "bin" / "python"


@pytest.mark.slow
def test_a_moved_copy_serves_without_the_project(repo_dir, tmp_path):
    python = runtime_python(tmp_path / "runtime")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    hidden = subprocess.run([str(python), "-c", "import bls"], cwd=elsewhere, capture_output=True, text=True)
    assert hidden.returncode != 0 and "No module named 'bls'" in hidden.stderr, "the project must be hidden"
    assert subprocess.run([str(python), "-c", "import numpy, transformers, torch"], cwd=elsewhere).returncode == 0

    moved = elsewhere / "model_repository"
    shutil.copytree(repo_dir, moved)  # a copy: no hard link back into build/
    with TritonServer(moved, log_path=tmp_path / "tritonserver.log", python=python, cwd=elsewhere) as server:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITE, "--repo", str(moved),
             "--server-url", f"127.0.0.1:{server.ports.http},{server.ports.grpc}"],
            cwd=ROOT, capture_output=True, text=True, timeout=900)
        log = (tmp_path / "tritonserver.log").read_text(errors="replace")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
    assert "files match repository.json" in log  # the models checked the copy against the manifest
