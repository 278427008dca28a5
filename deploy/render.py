"""`make k8s`: render deploy/templates with deploy/values.yaml (and overrides) for a built model repository into
build/k8s/, then validate what was rendered.

What the repository decides is read from its repository.json, never from values: GPUs per pod (TP x PP of the
engines, `world_size`), the path the engines were built to be served from (`serve_path`: TensorRT-LLM's backend
opens gpt_model_path as written), and tritonserver's argv (serving.tritonserver.server_command, the one
definition of how a repository is launched: mpirun with one rank per GPU, orchestrator mode for a draft; an LLM
API repository (ENGINE=llmapi) runs one tritonserver whose LLM starts its TP x PP ranks).

Validation (validate()): every core object against Kubernetes' OpenAPI schemas (kubernetes-validate, strict: an
unknown field is an error); the Prometheus Operator objects against their CRDs' schemas where a folder of CRD
files is given (--crd-dir or $PROMETHEUS_OPERATOR_CRDS: the operator's example/prometheus-operator-crd); the
rules themselves by promtool (tests/unit/test_k8s_rules.py).

    python -m deploy.render --repo build/model_repository --out build/k8s [--values my.yaml] [--set a.b=c ...]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

from serving.tritonserver import (
    CONTAINER_TRITONSERVER,
    ORCHESTRATOR_ENVIRONMENT,
    ServerPorts,
    exit_timeout_s,
    llm_spawns_ranks,
    needs_orchestrator,
    server_command,
)

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = Path(__file__).resolve().parent
TEMPLATES = DEPLOY / "templates"
RULES = DEPLOY / "prometheus" / "rules.yaml"
DASHBOARD = DEPLOY / "grafana" / "llama3-triton.json"
# The Kubernetes version whose schemas the core objects are held to (kubernetes-validate ships them), the oldest
# the manifests target: what they use (autoscaling/v2, policy/v1, appProtocol, sizeLimit) is older still.
KUBERNETES_VERSION = "1.30.0"
API_KEY_FILE = "/etc/llama3-api/api-key"
# How the API image (deploy/api.Dockerfile, its ENTRYPOINT) runs the API; the sidecar's command starts with it.
API_ENTRYPOINT = ("python3", "-m", "openai_api")
DEFAULT_SERVE_PATH = "/models/model_repository"  # the embedded engine's repository opens nothing by absolute path


class RenderError(ValueError):
    """Settings or a repository that cannot be deployed; the message says which and why."""


@dataclass(frozen=True)
class RepositoryFacts:
    engine: str  # trtllm | embedded | llmapi
    world_size: int  # GPUs per pod (TP x PP) for trtllm and llmapi on TensorRT-LLM
    serve_path: str
    orchestrator: bool
    llm_spawns_ranks: bool  # llmapi: one tritonserver, the LLM starts its own ranks
    gpu: bool  # TensorRT-LLM serves it (trtllm, or llmapi with llm tensorrt_llm; not its CPU stand-in)
    engine_models: tuple[str, ...]
    exit_timeout_s: int  # tritonserver's --exit-timeout-secs, sized from the repository's instance counts
    digest: str  # sha256 of repository.json (which holds every file's sha256): changes with any file

    @classmethod
    def read(cls, repo: Path) -> RepositoryFacts:
        manifest_file = repo / "repository.json"
        if not manifest_file.is_file():
            raise RenderError(f"{manifest_file} is missing: give --repo a repository `make repo` built")
        raw = manifest_file.read_bytes()
        manifest = json.loads(raw)
        engine = manifest.get("engine", "")
        serve_path = manifest.get("serve_path")
        if serve_path is None:
            if engine == "trtllm":
                raise RenderError(
                    "the repository's engines were built without SERVE_PATH, so their gpt_model_path points at the "
                    "build folder: rebuild with `make repo SERVE_PATH=/models/model_repository ...` or run "
                    "`python -m engine_build relocate --repo DIR --serve-path /models/model_repository`")
            serve_path = DEFAULT_SERVE_PATH
        return cls(
            engine=engine,
            world_size=int(manifest.get("world_size", 1)),
            serve_path=str(serve_path),
            orchestrator=needs_orchestrator(manifest),
            llm_spawns_ranks=llm_spawns_ranks(manifest),
            gpu=engine == "trtllm" or (engine == "llmapi" and manifest.get("llm") == "tensorrt_llm"),
            engine_models=("tensorrt_llm", "tensorrt_llm_draft") if manifest.get("draft") else ("tensorrt_llm",),
            exit_timeout_s=exit_timeout_s(manifest),
            digest=hashlib.sha256(raw).hexdigest(),
        )


def load_values(files: list[Path], sets: list[str]) -> dict[str, Any]:
    """deploy/values.yaml, each file merged over it in order, then each key.path=value (a YAML scalar)."""
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    for file in files:
        _merge(values, yaml.safe_load(file.read_text()) or {}, str(file))
    for assignment in sets:
        key, sep, raw = assignment.partition("=")
        if not sep or not key:
            raise RenderError(f"--set {assignment!r}: expected key.path=value")
        *parents, leaf = key.split(".")
        node = values
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise RenderError(f"--set {assignment!r}: {part!r} is not a section of the values")
            node = node[part]
        if leaf not in node:
            raise RenderError(f"--set {assignment!r}: no setting {key!r} (deploy/values.yaml lists them)")
        node[leaf] = yaml.safe_load(raw)
    return values


def _merge(base: dict, override: dict, source: str, path: str = "") -> None:
    for key, value in override.items():
        where = f"{path}{key}"
        if key not in base:
            raise RenderError(f"{source}: no setting {where!r} (deploy/values.yaml lists them)")
        if isinstance(base[key], dict) and isinstance(value, dict) and base[key]:
            _merge(base[key], value, source, where + ".")
        else:
            base[key] = value


def render(repo: Path, values: dict[str, Any]) -> dict[str, str]:
    """File name -> text of every rendered file (YAML manifests, the adapter's values, the dashboard)."""
    facts = RepositoryFacts.read(repo)
    v = copy.deepcopy(values)
    if v["repository"]["source"] not in ("volume", "s3"):
        raise RenderError(f"repository.source {v['repository']['source']!r} is neither volume nor s3")
    selector = {"app.kubernetes.io/name": "llama3-triton", "app.kubernetes.io/instance": v["name"]}
    labels = {**v["labels"], **selector, "app.kubernetes.io/component": "inference"}

    ports = ServerPorts(8000, 8001, 8002)
    triton_command = server_command(
        Path(facts.serve_path), ports, exit_timeout=facts.exit_timeout_s, address="0.0.0.0",
        world_size=facts.world_size, engine_model_names=facts.engine_models, orchestrator=facts.orchestrator,
        extra_args=tuple(v["triton"]["extraArgs"]), install=CONTAINER_TRITONSERVER, gpu=facts.gpu,
        llm_spawns_ranks=facts.llm_spawns_ranks)
    triton_env = dict(ORCHESTRATOR_ENVIRONMENT) if facts.orchestrator else {}
    requests = dict(v["triton"]["resources"].get("requests", {}))
    limits = dict(v["triton"]["resources"].get("limits", {}))
    if facts.gpu:  # one GPU per rank; a GPU is requested by its limit
        limits["nvidia.com/gpu"] = facts.world_size
    api_command = [*API_ENTRYPOINT, "--triton-grpc", f"localhost:{ports.grpc}", "--host", "0.0.0.0",
                   "--port", str(v["api"]["port"]), "--model-name", v["api"]["modelName"], "--repo", facts.serve_path,
                   "--workers", str(v["api"]["workers"])]
    if v["api"]["apiKeySecret"]:
        api_command += ["--api-key-file", API_KEY_FILE]

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                                     keep_trailing_newline=True)
    context = dict(v=v, repo=facts, labels=labels, selector=selector, triton_command=triton_command,
                   triton_env=triton_env, triton_requests=requests, triton_limits=limits, api_command=api_command,
                   rules=yaml.safe_load(RULES.read_text()), dashboard=DASHBOARD.read_text(),
                   pull_secrets=[{"name": name} for name in v["imagePullSecrets"]])
    files = {}
    for template in sorted(TEMPLATES.glob("*.yaml.j2")):
        text = environment.get_template(template.name).render(context)
        if text.strip():
            files[template.name.removesuffix(".j2")] = text
    if v["hpa"]["enabled"]:
        files["prometheus-adapter-values.yaml"] = adapter_values(v)
    files["grafana-dashboard.json"] = DASHBOARD.read_text()
    return files


def adapter_values(v: dict[str, Any]) -> str:
    """prometheus-adapter's Helm values: the recording rule llama3:engine_load:ratio served as the pods metric the HPA
    reads (custom.metrics.k8s.io), per pod of the namespace."""
    rule = {
        "seriesQuery": 'llama3:engine_load:ratio{namespace!="",pod!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": "^llama3:engine_load:ratio$", "as": v["hpa"]["metricName"]},
        "metricsQuery": "max by (<<.GroupBy>>) (<<.Series>>{<<.LabelMatchers>>})",
    }
    header = ("# prometheus-adapter (its Helm chart's values): `helm install prometheus-adapter "
              "prometheus-community/prometheus-adapter -f prometheus-adapter-values.yaml`.\n")
    return header + yaml.safe_dump({"rules": {"default": False, "custom": [rule]}}, sort_keys=False)


def validate(files: dict[str, str], crd_dir: Path | None = None) -> list[str]:
    """Every problem found (empty: valid). Core kinds: Kubernetes' schemas, strict; monitoring.coreos.com kinds:
    their CRDs' openAPIV3Schema when crd_dir is given, else one line saying they were not checked."""
    import kubernetes_validate

    problems = []
    crd_schemas = _crd_schemas(crd_dir) if crd_dir else {}
    for name, text in files.items():
        if not name.endswith(".yaml") or name == "prometheus-adapter-values.yaml":
            continue
        for document in yaml.safe_load_all(text):
            if not document:
                continue
            kind, api = document.get("kind"), document.get("apiVersion", "")
            if api.startswith("monitoring.coreos.com/"):
                schema = crd_schemas.get((api, kind))
                if schema is None:  # reported by unchecked_kinds
                    continue
                import jsonschema

                for error in jsonschema.Draft7Validator(schema).iter_errors(document):
                    problems.append(f"{name}: {kind}: {'.'.join(map(str, error.path))}: {error.message}")
                continue
            try:
                kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                problems.append(f"{name}: {kind}: {'.'.join(map(str, error.path))}: {error.message}")
    return problems


def unchecked_kinds(files: dict[str, str]) -> list[str]:
    """The Prometheus Operator objects, which only their CRDs' schemas validate."""
    found = []
    for name, text in files.items():
        if name.endswith(".yaml") and name != "prometheus-adapter-values.yaml":
            found += [f"{name}: {d['kind']}" for d in yaml.safe_load_all(text)
                      if d and d.get("apiVersion", "").startswith("monitoring.coreos.com/")]
    return found


def _crd_schemas(crd_dir: Path) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the object's JSON schema, from CustomResourceDefinition files; apiVersion and kind are
    checked by the lookup, metadata by Kubernetes itself, so the schema's own properties are what is validated."""
    schemas = {}
    for file in sorted(crd_dir.glob("*.yaml")):
        for crd in yaml.safe_load_all(file.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if schema:
                    schemas[(f"{group}/{version['name']}", kind)] = _strict(schema)
    return schemas


def _strict(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema that refuses unknown fields, as the API server prunes (or,
    with field validation Strict, refuses) them; x-kubernetes-* extensions dropped."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="a built model repository (its repository.json)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "k8s")
    parser.add_argument("--values", type=Path, action="append", default=[], help="YAML merged over deploy/values.yaml")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--crd-dir", type=Path, default=Path(os.environ["PROMETHEUS_OPERATOR_CRDS"])
                        if os.environ.get("PROMETHEUS_OPERATOR_CRDS") else None,
                        help="the Prometheus Operator's CRD files, to validate the PodMonitor and PrometheusRule")
    args = parser.parse_args(argv)
    try:
        files = render(args.repo, load_values(args.values, [s for item in args.sets for s in item.split()]))
    except RenderError as error:
        print(f"make k8s: {error}", file=sys.stderr)
        return 2
    problems = validate(files, args.crd_dir)
    if problems:
        print("make k8s: the rendered manifests are not valid:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.glob("*"):
        if stale.is_file() and stale.name not in files:
            stale.unlink()
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"make k8s: {len(files)} files in {args.out}, valid against Kubernetes {KUBERNETES_VERSION}'s schemas")
    if args.crd_dir is None:
        for item in unchecked_kinds(files):
            print(f"  not validated (no --crd-dir / PROMETHEUS_OPERATOR_CRDS): {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
