"""`make k8s` (deploy/render.py): what the rendered manifests say, and that they validate against Kubernetes' schemas
(kubernetes-validate, strict) and, where the Prometheus Operator's CRD files are given (PROMETHEUS_OPERATOR_CRDS),
the PodMonitor and PrometheusRule against theirs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from deploy.render import RULES, RenderError, load_values, render, unchecked_kinds, validate

CRDS = Path(os.environ["PROMETHEUS_OPERATOR_CRDS"]) if os.environ.get("PROMETHEUS_OPERATOR_CRDS") else None


def repository(tmp_path: Path, **manifest) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "repository.json").write_text(json.dumps({"engine": "embedded", "world_size": 1, "serve_path": None,
                                                      "draft": None, **manifest}))
    return repo


def objects(files: dict[str, str]) -> dict[str, dict]:
    """kind -> the one object of that kind."""
    found = {}
    for name, text in files.items():
        if name.endswith(".yaml") and name != "prometheus-adapter-values.yaml":
            for document in yaml.safe_load_all(text):
                if document:
                    assert document["kind"] not in found, f"two {document['kind']} objects"
                    found[document["kind"]] = document
    return found


def container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_the_grace_period_follows_the_repositorys_unload_time(tmp_path):
    """8 postprocessing instances unload one after another, 3 s each: the exit timeout is 5 + 24, the pod's grace
    period 30 s more; a TensorRT-LLM repository keeps 120 s (its unload is not measured)."""
    pod = objects(render(repository(tmp_path, postprocessing_instance_count=8), load_values([], [])))["Deployment"]
    assert "--exit-timeout-secs=29" in container(pod, "tritonserver")["command"]
    assert pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 59


def test_the_default_deployment_renders_every_object_and_validates(tmp_path):
    files = render(repository(tmp_path), load_values([], []))
    assert validate(files) == []
    found = objects(files)
    assert set(found) == {"Deployment", "Service", "HorizontalPodAutoscaler", "PodMonitor", "PrometheusRule",
                          "PodDisruptionBudget", "ConfigMap"}
    pod = found["Deployment"]["spec"]["template"]["spec"]
    triton = container(found["Deployment"], "tritonserver")
    assert triton["image"] == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["startupProbe"]["periodSeconds"] * triton["startupProbe"]["failureThreshold"] >= 1800
    assert triton["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert triton["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in pod["volumes"]
    assert "nvidia.com/gpu" not in triton["resources"]["limits"]  # the embedded engine runs on CPU
    assert "--model-repository=/models/model_repository" in triton["command"]
    # serving.tritonserver.exit_timeout_s: 5 s for the streams to end, then the embedded engine's 15 s unload.
    assert triton["command"].count("--exit-timeout-secs=20") == 1
    assert pod["terminationGracePeriodSeconds"] == 50
    api = container(found["Deployment"], "openai-api")
    assert api["command"][:3] == ["python3", "-m", "openai_api"]
    assert api["command"][api["command"].index("--triton-grpc") + 1] == "localhost:8001"
    assert api["command"][api["command"].index("--workers") + 1] == "2"  # values.yaml's api.workers
    assert api["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    ports = {p["name"]: p["port"] for p in found["Service"]["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
    scraped = {e["port"] for e in found["PodMonitor"]["spec"]["podMetricsEndpoints"]}
    assert scraped == {"metrics", "openai"}
    assert found["PrometheusRule"]["spec"] == yaml.safe_load(RULES.read_text())
    assert json.loads(found["ConfigMap"]["data"]["llama3-triton.json"])["uid"] == "llama3-triton"


def test_a_gpu_repository_asks_for_its_tp_times_pp_gpus_and_is_served_from_its_build_path(tmp_path):
    repo = repository(tmp_path, engine="trtllm", world_size=4, serve_path="/models/llama3-70b")
    files = render(repo, load_values([], []))
    assert validate(files) == []
    deployment = objects(files)["Deployment"]
    triton = container(deployment, "tritonserver")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 4
    command = triton["command"]
    assert command[0] == "mpirun" and command.count("/opt/tritonserver/bin/tritonserver") == 4  # one rank per GPU
    assert "--model-repository=/models/llama3-70b" in command and "--allow-gpu-metrics=false" not in command
    mounts = {m["name"]: m["mountPath"] for m in triton["volumeMounts"]}
    assert mounts == {"model-repository": "/models/llama3-70b", "dshm": "/dev/shm"}


def test_an_llmapi_repository_asks_for_tp_times_pp_gpus_and_runs_one_tritonserver(tmp_path):
    """ENGINE=llmapi on TensorRT-LLM: the LLM starts its own ranks under one tritonserver (serving.tritonserver
    server_command), from a relocatable repository (no serve path needed); its CPU stand-in asks for no GPU."""
    repo = repository(tmp_path, engine="llmapi", llm="tensorrt_llm", world_size=4)
    files = render(repo, load_values([], []))
    assert validate(files) == []
    triton = container(objects(files)["Deployment"], "tritonserver")
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 4
    command = triton["command"]
    assert command[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert command.count("/opt/tritonserver/bin/tritonserver") == 1 and "--allow-gpu-metrics=false" not in command
    assert "--model-repository=/models/model_repository" in command
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    triton = container(objects(render(repository(stand_in, engine="llmapi", llm="stand_in"),
                                      load_values([], [])))["Deployment"], "tritonserver")
    assert "nvidia.com/gpu" not in triton["resources"]["limits"] and "mpirun" not in triton["command"]


def test_a_repository_with_a_draft_runs_in_orchestrator_mode(tmp_path):
    repo = repository(tmp_path, engine="trtllm", world_size=2, serve_path="/models/r", draft="/build/draft")
    triton = container(objects(render(repo, load_values([], [])))["Deployment"], "tritonserver")
    env = {e["name"]: e["value"] for e in triton["env"]}
    assert env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    assert triton["command"][:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]


def test_engines_built_without_a_serve_path_are_refused_by_name(tmp_path):
    with pytest.raises(RenderError, match="SERVE_PATH"):
        render(repository(tmp_path, engine="trtllm", world_size=1), load_values([], []))


def test_an_object_store_repository_is_synced_by_an_init_container_to_the_serve_path(tmp_path):
    repo = repository(tmp_path, engine="trtllm", world_size=1, serve_path="/models/r")
    values = load_values([], ["repository.source=s3", "repository.s3.uri=s3://b/llama3",
                              "repository.s3.credentialsSecret=s3-creds", "api.apiKeySecret=llama3-key",
                              "imagePullSecrets=[ngc]"])
    files = render(repo, values)
    assert validate(files) == []
    pod = objects(files)["Deployment"]["spec"]["template"]["spec"]
    sync = pod["initContainers"][0]
    assert sync["command"][:3] == ["aws", "s3", "sync"] and sync["command"][-2:] == ["s3://b/llama3", "/models/r"]
    assert sync["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    assert pod["imagePullSecrets"] == [{"name": "ngc"}]
    volume = next(v for v in pod["volumes"] if v["name"] == "model-repository")
    assert "emptyDir" in volume
    api = container(objects(files)["Deployment"], "openai-api")
    assert api["command"][-2:] == ["--api-key-file", "/etc/llama3-api/api-key"]


def test_settings_that_do_not_exist_are_refused_by_name(tmp_path):
    with pytest.raises(RenderError, match="hpa.maxReplica"):
        load_values([], ["hpa.maxReplica=3"])
    override = tmp_path / "mine.yaml"
    override.write_text("triton:\n  imag: x\n")
    with pytest.raises(RenderError, match="triton.imag"):
        load_values([override], [])
    override.write_text("replicas: 3\nhpa: {maxReplicas: 9}\n")
    values = load_values([override], [])
    assert values["replicas"] == 3 and values["hpa"]["maxReplicas"] == 9 and values["hpa"]["minReplicas"] == 1


def test_the_validator_refuses_what_kubernetes_would(tmp_path):
    """The check can fail: an unknown field and a wrong type in the Deployment are both reported."""
    files = render(repository(tmp_path), load_values([], []))
    unknown = yaml.safe_load(files["deployment.yaml"])
    unknown["spec"]["replicaz"] = 2
    problems = validate({"deployment.yaml": yaml.safe_dump(unknown)})
    assert len(problems) == 1 and "replicaz" in problems[0], problems
    wrong_type = yaml.safe_load(files["deployment.yaml"])
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "soon"
    problems = validate({"deployment.yaml": yaml.safe_dump(wrong_type)})
    assert len(problems) == 1 and "terminationGracePeriodSeconds" in problems[0], problems


def test_the_hpa_reads_the_metric_the_adapter_serves_from_the_recording_rule(tmp_path):
    files = render(repository(tmp_path), load_values([], []))
    hpa = objects(files)["HorizontalPodAutoscaler"]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    adapter = yaml.safe_load(files["prometheus-adapter-values.yaml"])["rules"]["custom"][0]
    assert adapter["name"]["as"] == metric
    recorded = {rule.get("record") for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    assert adapter["name"]["matches"].strip("^$") in recorded


@pytest.mark.skipif(CRDS is None, reason="PROMETHEUS_OPERATOR_CRDS is not set: the PodMonitor and PrometheusRule are "
                                         "validated only against the Prometheus Operator's CRD files "
                                         "(example/prometheus-operator-crd), which are not shipped here")
def test_the_prometheus_operator_objects_validate_against_their_crds(tmp_path):
    files = render(repository(tmp_path), load_values([], []))
    assert unchecked_kinds(files) == ["podmonitor.yaml: PodMonitor", "prometheusrule.yaml: PrometheusRule"]
    assert validate(files, CRDS) == []
    broken = yaml.safe_load(files["podmonitor.yaml"])
    broken["spec"]["podMetricsEndpoints"][0]["portz"] = "metrics"
    assert any("portz" in p for p in validate({"podmonitor.yaml": yaml.safe_dump(broken)}, CRDS))
