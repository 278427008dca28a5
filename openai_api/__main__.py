"""python -m openai_api --triton-grpc HOST:PORT [--host 127.0.0.1] [--port 9000] [--model-name NAME] [--repo DIR]
[--api-key-file FILE]: the OpenAI-compatible API in front of a running tritonserver (docs/openai.md)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import uvicorn

from openai_api.app import Settings, create_app
from openai_api.models import adapter_names, base_model_name, repository_manifest


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m openai_api", description=__doc__)
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
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "info"))
    args = parser.parse_args(argv)

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    manifest = repository_manifest(args.repo)
    settings = Settings(
        triton_grpc=args.triton_grpc,
        model_name=args.model_name or base_model_name(manifest),
        adapters=adapter_names(manifest),
        api_keys=read_api_keys(args.api_key_file) if args.api_key_file else (),
        max_body_bytes=args.max_body_bytes,
        default_max_tokens=args.default_max_tokens,
        created=int(time.time()),
    )
    try:
        app = create_app(settings)
    except ValueError as error:  # a served model id that is ambiguous
        sys.exit(f"python -m openai_api: {error}")
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
