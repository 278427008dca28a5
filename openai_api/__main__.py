"""python -m openai_api --triton-grpc HOST:PORT [--host 127.0.0.1] [--port 9000] [--model-name NAME] [--repo DIR]
[--api-key-file FILE] [--workers N]: the OpenAI-compatible API in front of a running tritonserver (docs/openai.md).

It runs as N uvicorn worker processes serving one port (uvicorn's supervisor binds it and restarts a worker that
dies): one Python process tops out near a core (issue 49: 0.96-0.98 of a core from 64 streams up). They share one
key file (each reads it) and one /metrics view: prometheus_client's multiprocess mode, its values in files under
a private directory made at start (0700, new each start: no stale values) and removed at stop."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import uvicorn

from openai_api.models import adapter_names, base_model_name, repository_manifest

# The workers' settings (JSON; the key file's path, never the keys), from main() to worker_app().
SETTINGS_ENV = "LLAMA3_API_SETTINGS"
# prometheus_client's multiprocess mode: read when prometheus_client is imported, so set before openai_api.app is.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def default_workers() -> int:
    """One worker per 4 cores this process may run on, at least one (the rest are tritonserver's)."""
    return max(1, len(os.sched_getaffinity(0)) // 4)


def read_api_keys(path: Path) -> tuple[str, ...]:
    """One key per line (blank lines and # comments skipped). A file others may read is used with a warning: a
    Kubernetes Secret volume's files are 0644 unless its defaultMode says otherwise (`make serve` writes 0600)."""
    if path.stat().st_mode & 0o077:
        logging.getLogger("openai_api").warning("--api-key-file %s is readable by group or others: chmod 600 it "
                                                "(a Kubernetes Secret volume is private to its pod: there this is "
                                                "expected, deploy/ keeps the default mode so that the API's non-root "
                                                "user can read it)", path)
    keys = tuple(line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#"))
    if not keys:
        sys.exit(f"--api-key-file {path}: holds no key")
    return keys


def worker_app():
    """uvicorn's app factory, in each worker: the settings main() left in the environment, the keys from the file."""
    from openai_api.app import Settings, create_app

    fields = json.loads(os.environ[SETTINGS_ENV])
    key_file = fields.pop("api_key_file")
    return create_app(Settings(**fields | {"adapters": tuple(fields["adapters"]),
                                           "api_keys": read_api_keys(Path(key_file)) if key_file else ()}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m openai_api", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--triton-grpc", required=True, help="tritonserver's gRPC endpoint, HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--model-name", help="the model id clients send (default: from --repo's checkpoint)")
    parser.add_argument("--repo", type=Path,
                        help="the served model repository (for the model's name and its LoRA adapters' names)")
    parser.add_argument("--api-key-file", type=Path, help="file of accepted API keys, one a line (default: none)")
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--default-max-tokens", type=int, default=1024,
                        help="the output limit of a request that sets none")
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="worker processes serving the port (default: one per 4 cores, at least one: "
                             "%(default)s here)")
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, not {args.workers}")

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.api_key_file:
        read_api_keys(args.api_key_file)  # a missing or empty key file stops here, before any worker starts
    manifest = repository_manifest(args.repo)
    metrics_dir = tempfile.mkdtemp(prefix="llama3-api-metrics-")  # 0700
    os.environ[METRICS_DIR_ENV] = metrics_dir
    try:
        from openai_api.app import Settings, create_app

        settings = Settings(triton_grpc=args.triton_grpc, model_name=args.model_name or base_model_name(manifest),
                            adapters=adapter_names(manifest), max_body_bytes=args.max_body_bytes,
                            default_max_tokens=args.default_max_tokens, created=int(time.time()))
        try:
            create_app(settings)  # a served model id that is ambiguous stops here, before any worker starts
        except ValueError as error:
            sys.exit(f"python -m openai_api: {error}")
        fields = {name: value for name, value in dataclasses.asdict(settings).items() if name != "api_keys"}
        os.environ[SETTINGS_ENV] = json.dumps(fields | {
            "api_key_file": str(args.api_key_file.resolve()) if args.api_key_file else None})
        uvicorn.run("openai_api.__main__:worker_app", factory=True, workers=args.workers, host=args.host,
                    port=args.port, log_level=args.log_level.lower(), timeout_graceful_shutdown=5)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop(METRICS_DIR_ENV, None)  # main() called in-process (a test) leaves no trace behind
        os.environ.pop(SETTINGS_ENV, None)


if __name__ == "__main__":
    main()
