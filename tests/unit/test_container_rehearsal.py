"""The rehearsal runs what the README's container block says, in its order (tools/container_rehearsal.py)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.container_rehearsal import (
    TENSORRT_LLM_API,
    install_tensorrt_llm_stand_in,
    is_gpu_build,
    readme_commands,
    readme_llmapi_commands,
)

PROJECT = Path(__file__).resolve().parents[2]


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


def test_the_readme_llmapi_block_is_what_the_rehearsal_runs():
    """The LLM API block: its GPU build (replaced by the repository it assembles), then make serve-only of the
    repository the container block's make test reads."""
    commands = readme_llmapi_commands()
    assert [" ".join(c.split()[:2]) for c in commands] == ["make repo", "make serve-only"], commands
    assert "ENGINE=llmapi" in commands[0] and is_gpu_build(commands[0])
    assert "REPO=build/model_repository" in commands[1].split()
    (test,) = [c for c in readme_commands() if c.startswith("make test ")]
    assert "REPO=build/model_repository" in test.split()


def test_only_an_llmapi_build_of_an_hf_model_needs_a_gpu():
    assert not is_gpu_build("make repo ENGINE=llmapi")  # the CPU stand-in's build
    assert not is_gpu_build("make repo ENGINE=llmapi DRY_RUN=1 GPU_ARCH=hopper GPU_MEM_GB=80 HF_MODEL=/m")
    assert is_gpu_build("make repo ENGINE=llmapi HF_MODEL=/m QUANT=fp8")
    assert not is_gpu_build("make serve-only ENGINE=llmapi HF_MODEL=/m")


def test_the_stand_in_package_has_every_import_of_the_llm_api_our_code_makes():
    """TENSORRT_LLM_API holds each `from tensorrt_llm... import ...` of llmapi_engine/llm_api.py."""
    tree = ast.parse((PROJECT / "llmapi_engine" / "llm_api.py").read_text())
    imported = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module and node.module.split(".")[0] == "tensorrt_llm" for alias in node.names}
    assert len(imported) == 5, imported
    offered = {(".".join(["tensorrt_llm", *filter(None, module.split("/"))]), name)
               for module, names in TENSORRT_LLM_API.items() for name in names}
    assert imported <= offered, imported - offered


def test_the_stand_in_package_is_the_stand_in_and_says_it_is_not_tensorrt_llm(tmp_path):
    """Installed into a site-packages, `tensorrt_llm` gives the stand-in's classes from its own private copy (the
    model's vendored packages stay the only ones it imports) and says at import that it is not TensorRT-LLM."""
    package = install_tensorrt_llm_stand_in(tmp_path)
    assert "THIS IS NOT TensorRT-LLM" in (package / "__init__.py").read_text()
    probe = ("import json, sys\n"
             f"sys.path.insert(0, {str(tmp_path)!r})\n"
             "from tensorrt_llm import LLM, SamplingParams\n"
             "from tensorrt_llm.executor.request import LoRARequest\n"
             "from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict\n"
             "from tensorrt_llm.sampling_params import GuidedDecodingParams\n"
             "names = [LLM, SamplingParams, LoRARequest, update_llm_args_with_extra_dict, GuidedDecodingParams]\n"
             "print(json.dumps({'modules': [n.__module__ for n in names],\n"
             "                  'ours': sorted(m for m in sys.modules if m.split('.')[0] in\n"
             "                                 ('bls', 'embedded_engine', 'llmapi_engine'))}))\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True)
    reply = json.loads(result.stdout)
    assert all(module.startswith("tensorrt_llm._stand_in.llmapi_engine.stand_in.") for module in reply["modules"])
    assert reply["ours"] == []  # nothing of the project's top-level packages
    assert "THIS IS NOT TensorRT-LLM" in result.stderr
