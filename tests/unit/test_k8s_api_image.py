"""deploy/api.Dockerfile, the OpenAI API's image (`make api-image`, the Deployment's `api.image`), read statically
(dockerfile-parse; no docker daemon in CI): a pinned base, exactly pyproject.toml's API pins, a non-root user, the
entrypoint the Deployment runs; and what it copies and installs is all `python -m openai_api` imports (run here with
every other import refused)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from deploy.api_requirements import API_CORE, api_requirements, requirement_name
from deploy.render import API_ENTRYPOINT, load_values, render
from tests.unit.test_k8s import container, objects, repository

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "api.Dockerfile"
PYPROJECT = ROOT / "pyproject.toml"


def instructions(name: str) -> list[str]:
    return [i["value"] for i in DockerfileParser(str(DOCKERFILE)).structure if i["instruction"] == name]


def copied_sources() -> list[str]:
    """Every source path of the COPY instructions (the last word of each is its destination)."""
    return [source for value in instructions("COPY") for source in value.split()[:-1]]


def test_the_base_image_is_pinned_to_an_exact_python_release():
    (base,) = instructions("FROM")
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base


def test_the_image_installs_the_api_extra_and_the_core_pins_it_imports_nothing_else():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = api_requirements(PYPROJECT)
    assert requirements[len(API_CORE):] == project["optional-dependencies"]["api"]
    core = {requirement_name(r): r for r in project["dependencies"]}
    assert requirements[:len(API_CORE)] == [core[name] for name in API_CORE]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+==[0-9][0-9A-Za-z.]*", r) for r in requirements), requirements
    assert not {"transformers", "torch", "tokenizers"} & {requirement_name(r) for r in requirements}
    # The one pip install: the generated file, from the pyproject.toml and script the image copies.
    installs = [run for run in instructions("RUN") if "pip install" in run]
    assert len(installs) == 1
    assert re.search(r"python3 api_requirements\.py pyproject\.toml > requirements-api\.txt\s+&& "
                     r"pip install --no-cache-dir -r requirements-api\.txt(\s|$)", installs[0]), installs[0]
    assert {"pyproject.toml", "deploy/api_requirements.py"} <= set(copied_sources())


def test_the_generator_runs_on_the_bare_interpreter_and_prints_the_same_list():
    out = subprocess.run([sys.executable, "-I", str(ROOT / "deploy" / "api_requirements.py"), str(PYPROJECT)],
                         capture_output=True, text=True, check=True, cwd="/").stdout
    assert out.splitlines() == api_requirements(PYPROJECT)


def test_it_runs_as_a_non_root_user_and_starts_the_command_the_deployment_runs(tmp_path):
    users = instructions("USER")
    assert users and users[-1] not in ("root", "0"), users
    assert json.loads(instructions("ENTRYPOINT")[-1]) == list(API_ENTRYPOINT)
    values = load_values([], [])
    api = container(objects(render(repository(tmp_path), values))["Deployment"], "openai-api")
    assert api["image"] == values["api"]["image"]
    assert api["command"][:len(API_ENTRYPOINT)] == list(API_ENTRYPOINT)
    assert api["securityContext"]["runAsNonRoot"] is True
    assert f"EXPOSE {values['api']['port']}" in DOCKERFILE.read_text()


def closure_top_level_modules(requirements: list[str]) -> set[str]:
    """The importable top-level names of these requirements' distributions and all they require (with their extras),
    as installed in this venv, which must hold the same pins."""
    names, seen = set(), set()
    pending = [(Requirement(r), True) for r in requirements]
    while pending:
        requirement, pinned = pending.pop()
        key = (requirement_name(requirement.name), tuple(sorted(requirement.extras)))
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(requirement.name)
        if pinned:
            assert requirement.specifier.contains(dist.version), f"this venv has {dist.name} {dist.version}"
        top_level = dist.read_text("top_level.txt")
        names |= set(top_level.split()) if top_level else {
            Path(str(f)).parts[0].removesuffix(".py") for f in dist.files or ()
            if not str(f).startswith(("..", "/")) and ".dist-info" not in str(f) and ".libs" not in str(f)}
        for raw in dist.requires or ():
            child = Requirement(raw)
            if child.marker is None or any(child.marker.evaluate({"extra": extra})
                                           for extra in ("", *requirement.extras)):
                pending.append((child, False))
    return names


GUARD = """
import importlib.abc, importlib.machinery, runpy, site, sys, sysconfig
allowed = set(sys.argv[1].split(","))
stdlib, installed = sysconfig.get_paths()["stdlib"], tuple(site.getsitepackages())
class Refuse(importlib.abc.MetaPathFinder):
    \"\"\"A top-level module found anywhere but the standard library and not allowed is missing, as in the image.\"\"\"
    def find_spec(self, name, path=None, target=None):
        if "." in name or name in allowed or name in sys.stdlib_module_names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name)
        origin = spec.origin or "" if spec else ""
        if spec is None or origin.startswith(stdlib) and not origin.startswith(installed):
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not in the API image)", name=name)
sys.meta_path.insert(0, Refuse())
sys.argv = ["python -m openai_api", "--help"]
try:
    runpy.run_module("openai_api", run_name="__main__", alter_sys=True)
finally:
    print("LOADED", sorted({m.__file__ for n, m in sys.modules.items()
                            if n.partition(".")[0] in ("bls", "openai_api") and getattr(m, "__file__", None)}))
"""


def test_the_api_starts_with_only_what_the_image_copies_and_installs(tmp_path):
    """`python -m openai_api --help` imports every module the API serves with (all imports are at module level):
    it runs with the image's two packages, copied alone, and the distributions of its pins; anything else (torch,
    transformers, the project's other packages, the test extra) is refused."""
    packages = [source.rstrip("/") for source in copied_sources() if (ROOT / source).is_dir()]
    assert sorted(packages) == ["bls", "openai_api"]
    for package in packages:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    allowed = closure_top_level_modules(api_requirements(PYPROJECT)) | set(packages)
    assert not {"torch", "transformers", "tokenizers", "jinja2", "engine_build", "serving"} & allowed
    result = subprocess.run([sys.executable, "-B", "-c", GUARD, ",".join(sorted(allowed))], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--triton-grpc" in result.stdout
    loaded = json.loads(result.stdout.rpartition("LOADED ")[2].replace("'", '"'))
    assert loaded and all(Path(path).is_relative_to(tmp_path) for path in loaded), loaded
