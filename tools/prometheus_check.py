"""`make prometheus-check`: a real Prometheus scraping a real tritonserver (and the OpenAI API) under a soak.

    python -m tools.prometheus_check --repo build/model_repository [--duration 60] [--concurrency 48]

1. Serves a variant of --repo whose engine is the synthetic one at a GPU-like step (tools/soak.py's), with few
   batch slots (--engine-slots) so that the load queues, and the ensemble's handoff (its latency metrics are
   measured there); starts the OpenAI API (python -m openai_api) against it.
2. Starts Prometheus (Debian's `prometheus` package) scraping both every second, with deploy/prometheus/rules.yaml
   loaded (group intervals shortened to 2 s), the targets labelled as the PodMonitor's would be (namespace, pod).
3. Idle, then `tools/soak.py --server-url` for --duration seconds (plus streamed chat completions through the API),
   then idle again; samples the autoscaling signal (llama3:engine_load:ratio) all along.
4. Checks: every query of the Grafana dashboard (deploy/grafana/llama3-triton.json) returns data during the load;
   the signal rose with the load and fell back to its idle value after it. Prints each result; exits 1 on a miss.

What it cannot show: the HPA loop and prometheus-adapter themselves (no cluster here): the adapter serves the
recorded series unchanged (deploy/render.py's adapter_values), and the HPA's arithmetic is Kubernetes'.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import yaml

from bls.contract import BLS_MODEL
from engine_build.repository import variant_repository
from serving.tritonserver import ServerPorts, TritonServer, answers_200

ROOT = Path(__file__).resolve().parents[1]

RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "llama3-triton.json"
SIGNAL = "llama3:engine_load:ratio"
LABELS = {"namespace": "local", "pod": "llama3-triton-0"}
API_MODEL = "llama3"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def consecutive_ports() -> ServerPorts:
    """Three free ports in a row: tools/soak.py --server-url reads the metrics at the HTTP port + 2."""
    for _ in range(100):
        base = free_port()
        sockets = []
        try:
            for port in (base, base + 1, base + 2):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return ServerPorts(base, base + 1, base + 2)
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no three consecutive free ports")


def wait_http(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{process.args[0]} exited with {process.returncode}")
        if answers_200(url):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")


class Prometheus:
    def __init__(self, binary: str, workdir: Path, targets: dict[str, str]):
        """targets: job -> host:port whose /metrics is scraped."""
        self.port = free_port()
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            group["interval"] = "2s"  # the deployment's 15 s would leave a short run with few points
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "2s"},
            "rule_files": [str(workdir / "rules.yaml")],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [address], "labels": LABELS}]}
                               for job, address in targets.items()],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = open(workdir / "prometheus.log", "wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"http://127.0.0.1:{self.port}/-/ready", 60, self.process)

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{expr}: {body}")
        return body["data"]["result"]

    def targets_up(self) -> dict[str, float]:
        return {r["metric"]["job"]: float(r["value"][1]) for r in self.query("up")}

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        self.log.close()


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) of every target of the dashboard, with Grafana's variables as Prometheus takes them."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "15s").replace("$namespace", ".*")
            queries.append((panel["title"], expr))
    return queries


def api_chat_load(api: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Streamed chat completions through the API until `stop`, one at a time (its metrics need traffic)."""
    host, port = api.split(":")
    body = json.dumps({"model": API_MODEL, "stream": True, "max_tokens": 24,
                       "messages": [{"role": "user", "content": "Say something about Prometheus."}]})
    while not stop.is_set():
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            counts["ok" if response.status == 200 else f"status {response.status}"] += 1
        except OSError as error:
            counts[f"error {type(error).__name__}"] += 1
            stop.wait(1.0)
        finally:
            connection.close()


def sample_signal(prometheus: Prometheus, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    while not stop.wait(2.0):
        result = prometheus.query(SIGNAL)
        if result:
            samples.append((time.time(), float(result[0]["value"][1])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.prometheus_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "build" / "model_repository")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of soak")
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--engine-slots", type=int, default=8, help="max_active_requests of the engine (batch slots)")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle before and after the load")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "prometheus-check")
    args = parser.parse_args(argv)
    binary = shutil.which("prometheus")
    if binary is None:
        print("prometheus is not installed (Debian: apt-get install -y prometheus)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="prometheus-check-", dir=args.out))
    repo = variant_repository(args.repo.resolve(), workdir / "repo", synthetic=True, step_ms=args.step_ms,
                              merge_streamed_tokens=False, max_active_requests=args.engine_slots,
                              max_queued_requests=4 * args.concurrency, handoff_sender_threads=1)
    results: list[tuple[str, bool, str]] = []
    with TritonServer(repo, ports=consecutive_ports(), log_path=workdir / "tritonserver.log") as server:
        api_port = free_port()
        api_log = open(workdir / "openai_api.log", "wb")
        api = subprocess.Popen(
            [sys.executable, "-m", "openai_api", "--triton-grpc", server.grpc_url, "--host", "127.0.0.1",
             "--port", str(api_port), "--model-name", API_MODEL, "--repo", str(repo)],
            cwd=ROOT, stdout=api_log, stderr=subprocess.STDOUT, start_new_session=True)
        prometheus = None
        try:
            wait_http(f"http://127.0.0.1:{api_port}/health/ready", 120, api)
            metrics_address = server.metrics_url.removeprefix("http://").removesuffix("/metrics")
            prometheus = Prometheus(binary, workdir, {"triton": metrics_address, "openai-api": f"127.0.0.1:{api_port}"})
            deadline = time.monotonic() + 30
            while (up := prometheus.targets_up()) != {"triton": 1.0, "openai-api": 1.0} and time.monotonic() < deadline:
                time.sleep(1)
            results.append(("both targets scraped (up == 1)", up == {"triton": 1.0, "openai-api": 1.0}, str(up)))

            samples: list[tuple[float, float]] = []
            stop_sampling = threading.Event()
            sampler = threading.Thread(target=sample_signal, args=(prometheus, stop_sampling, samples), daemon=True)
            sampler.start()
            time.sleep(args.idle)
            load_start = time.time()
            stop_api = threading.Event()
            api_counts: Counter[str] = Counter()
            api_threads = [threading.Thread(target=api_chat_load, args=(f"127.0.0.1:{api_port}", stop_api,
                                                                        api_counts), daemon=True) for _ in range(2)]
            for thread in api_threads:
                thread.start()
            # The API's load ends with the soak's, before the soak checks that the engine emptied.
            threading.Timer(args.duration, stop_api.set).start()
            soak = subprocess.run(
                [sys.executable, "-m", "tools.soak",
                 "--server-url", f"{server.http_url},{server.grpc_url.split(':')[1]}",
                 "--duration", str(args.duration), "--concurrency", str(args.concurrency), "--warmup", "5",
                 "--report", str(workdir / "soak.json")],
                cwd=ROOT, capture_output=True, text=True)
            stop_api.set()
            for thread in api_threads:
                thread.join(150)
            load_end = time.time()
            (workdir / "soak.log").write_text(soak.stdout + soak.stderr)
            soak_result = next((line for line in soak.stdout.splitlines() if line.startswith("RESULT:")), "no RESULT")
            results.append(("soak against the server", soak.returncode == 0, soak_result))
            results.append(("API chat completions during the load", api_counts.get("ok", 0) > 0, dict(api_counts)))

            # Every dashboard query, evaluated at the end of the load.
            for title, expr in dashboard_queries():
                series = prometheus.query(expr, at=load_start + args.duration - 2)
                values = sorted({round(float(s["value"][1]), 4) for s in series})
                detail = f"{len(series)} series, values {values[:6]}"
                results.append((f"dashboard: {title}: {expr[:90]}", bool(series), detail))
            for model in (BLS_MODEL, "ensemble"):
                count = prometheus.query(
                    f'sum(increase(llm_e2e_request_latency_seconds_count{{model="{model}"}}[10m]))')
                n = float(count[0]["value"][1]) if count else 0.0
                results.append((f"{model}: requests in its latency histograms", n > 0, f"{n:.0f}"))

            time.sleep(args.idle)
            stop_sampling.set()
            sampler.join(10)
            before = [v for t, v in samples if t < load_start]
            during = [v for t, v in samples if load_start + 5 <= t <= load_start + args.duration]
            after = [v for t, v in samples if t >= load_end + args.idle / 2]  # load_end: the soak's quiesce checked
            idle_value = max(before) if before else None
            peak = max(during) if during else None
            results.append(("signal idle before the load", bool(before) and idle_value == 0.0,
                            f"{len(before)} samples, max {idle_value}"))
            results.append(("signal rose with the load (above 1: requests waited for a slot)",
                            peak is not None and peak > 1.0, f"{len(during)} samples, peak {peak}, "
                            f"mean {sum(during) / len(during) if during else None:.2f}"))
            results.append(("signal fell back after the load", bool(after) and max(after) == 0.0,
                            f"{len(after)} samples, max {max(after) if after else None}"))
            (workdir / "signal.json").write_text(json.dumps(
                {"load_start": load_start, "load_end": load_end, "samples": samples}, indent=1))
        finally:
            if prometheus is not None:
                prometheus.stop()
            if api.poll() is None:
                os.killpg(api.pid, signal.SIGTERM)
                api.wait(30)
            api_log.close()
    width = max(len(name) for name, _, _ in results)
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name:{width}s}  {detail}")
    failed = [name for name, ok, _ in results if not ok]
    print(f"RESULT: {'PASS' if not failed else 'FAIL: ' + '; '.join(failed)} (files in {workdir})")
    (workdir / "result.json").write_text(json.dumps([{"check": n, "ok": ok, "detail": str(d)} for n, ok, d in results],
                                                    indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
