"""The rehearsal runs what the README's container block says, in its order (tools/container_rehearsal.py)."""

from __future__ import annotations

import re

import pytest

from tools.container_rehearsal import is_gpu_build, readme_commands


def test_the_readme_container_block_is_what_the_rehearsal_runs():
    commands = readme_commands()
    kinds = [" ".join(c.split()[:2]) for c in commands]
    assert kinds == ["make repo", "make repo", "make check-repo", "make serve-only", "make test"], commands
    assert "DRY_RUN=1" in commands[0] and not is_gpu_build(commands[0])
    assert is_gpu_build(commands[1])  # the one step the rehearsal cannot run (TensorRT-LLM), replaced by an artifact
    assert "SERVER_URL=localhost:8000" in commands[-1]
    repo = {word for c in commands[2:] for word in c.split() if word.startswith("REPO=")}
    assert repo == {"REPO=build/model_repository"}  # the rehearsal puts the served artifact there


def test_comments_and_continuations_are_not_commands(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\ndocker run --rm nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 bash\n"
                      "make serve-only REPO=x   # check, then serve\n#   + TP=4 (comment)\n"
                      "make test SERVER_URL=h:1\n```\n"
                      "```bash\nmake serve\n```\n")
    assert readme_commands(readme) == ["make serve-only REPO=x", "make test SERVER_URL=h:1"]


def test_a_line_the_rehearsal_cannot_run_stops_it(tmp_path):
    readme = tmp_path / "README.md"
    for line in ("export TP=2", "make repo ENGINE=trtllm \\\n    HF_MODEL=x"):
        readme.write_text(
            f"```bash\ndocker run --rm nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3 bash\n{line}\n```\n")
        with pytest.raises(SystemExit, match="none the rehearsal runs"):
            readme_commands(readme)


def test_the_image_packages_hold_what_the_image_ships_for_our_code():
    """IMAGE_PACKAGES (what the rehearsal's image venv installs) covers engine_build/container_python.SHIPPED."""
    from engine_build.container_python import SHIPPED
    from tools.container_rehearsal import IMAGE_PACKAGES

    installed = {entry.split("==")[0].split("[")[0].lower().replace("_", "-") for entry in IMAGE_PACKAGES}
    shipped = {re.split(r"[<>= ]", entry.distribution)[0].lower().replace("_", "-")
               for entry in SHIPPED if entry.module != "triton_python_backend_utils"}
    assert shipped <= installed, shipped - installed
