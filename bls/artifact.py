"""The model repository as a shipped artifact: every Python model checks, when it loads, that the files it
serves from are the files `make repo` wrote (repository.json records a SHA-256 per file), so a repository
copied incompletely, or edited after the build, fails at load with the file named, not at the first request.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "repository.json"


class ArtifactError(RuntimeError):
    pass


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_checksums(root: Path) -> dict[str, str]:
    """SHA-256 of every file under `root` (but the manifest), by path relative to `root`."""
    return {
        path.relative_to(root).as_posix(): sha256_file(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != MANIFEST and "__pycache__" not in path.parts
    }


def verify_model_files(version_dir: Path) -> str:
    """Check the files of one model's version folder (`<repo>/<model>/1`) against repository.json.

    Returns what was checked, for the log; raises ArtifactError naming the first file that is missing or
    differs. A repository without a manifest (assembled by hand) is not checked, and the answer says so.
    """
    version_dir = Path(version_dir).resolve()
    repo = version_dir.parent.parent
    manifest = repo / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} beside the models: files not checked"
    recorded = json.loads(manifest.read_text()).get("files", {})
    prefix = version_dir.relative_to(repo).as_posix() + "/"
    mine = {name: digest for name, digest in recorded.items() if name.startswith(prefix)}
    for name, digest in mine.items():
        path = repo / name
        if not path.is_file():
            raise ArtifactError(f"{name} is missing: the repository was copied incompletely (rebuild or re-copy it)")
        if sha256_file(path) != digest:
            raise ArtifactError(f"{name} differs from what `make repo` wrote (SHA-256 in {MANIFEST}): "
                                "the repository was modified or damaged after the build")
    return f"{len(mine)} files match {MANIFEST}"
