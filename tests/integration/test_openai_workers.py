"""`python -m openai_api --workers 2`: two worker processes serve one port, with one key file and one /metrics
view (prometheus_client's multiprocess mode), whichever worker a connection lands on."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil

from testkit.metrics import metric_sum, metric_value
from testkit.openai_api import openai_api

KEY = "sk-two-workers"
ASK = [{"role": "user", "content": "Name three colours."}]
ROUND = 8  # requests at once, each on a connection of its own: the workers take them as they accept them


def _metric_files_by_pid(metrics_dir: Path) -> set[int]:
    """The worker processes that wrote a counter (prometheus_client: counter_<pid>.db)."""
    return {int(match[1]) for path in metrics_dir.iterdir() if (match := re.fullmatch(r"counter_(\d+)\.db", path.name))}


def test_two_workers_serve_one_port_with_one_key_file_and_one_metrics_view(endpoint, repo_dir, tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"{KEY}\n")
    key_file.chmod(0o600)
    with openai_api(endpoint.grpc, tmp_path / "api.log", "--repo", str(repo_dir), "--model-name", "llama3-test",
                    "--api-key-file", str(key_file), "--workers", "2") as api:
        supervisor = psutil.Process(api.process.pid)
        workers = {child.pid for child in supervisor.children() if "spawn_main" in " ".join(child.cmdline())}
        assert len(workers) == 2, workers
        metrics_dir = Path(psutil.Process(min(workers)).environ()["PROMETHEUS_MULTIPROC_DIR"])
        assert metrics_dir.stat().st_mode & 0o777 == 0o700

        def chat(key: str) -> int:
            body = {"model": "llama3-test", "messages": ASK, "max_tokens": 4, "stream": True}
            with httpx.stream("POST", f"{api.v1}/chat/completions", json=body, timeout=120,
                              headers={"Authorization": f"Bearer {key}"}) as response:
                response.read()
                return response.status_code

        served = 0
        with ThreadPoolExecutor(ROUND) as pool:
            # Until both workers answered some (which worker accepts a connection is the kernel's choice).
            while _metric_files_by_pid(metrics_dir) != workers:
                assert served < 40 * ROUND, f"one worker took every connection: {_metric_files_by_pid(metrics_dir)}"
                assert list(pool.map(chat, [KEY] * ROUND)) == [200] * ROUND  # the key holds on either worker
                served += ROUND
            assert list(pool.map(chat, ["sk-wrong"] * ROUND)) == [401] * ROUND
        # Every scrape, on a new connection to whichever worker, sums both workers' counts.
        for _ in range(6):
            assert metric_sum(f"{api.url}/metrics", "llama3_api_request_success_total", "llama3-test") == served
        assert metric_value(f"{api.url}/metrics", "llama3_api_requests_in_flight", "llama3-test") == 0
    assert not metrics_dir.exists()  # removed at stop
