"""Triton's own load tools against the served repository: perf_analyzer and genai-perf (streaming, gRPC).

    python -m tools.perf_tools perf-analyzer --perf-venv build/venv-perf [--url HOST:GRPC_PORT]
    python -m tools.perf_tools genai-perf --genai-venv build/venv-genai-perf --perf-venv build/venv-perf \
        --tokenizer build/assets/tokenizer [--url HOST:GRPC_PORT]

Without --url a tritonserver is started on --repo (loopback, free ports) for the run. With --url the same
commands measure any deployment, e.g. the NGC container on a GPU box; pass its tokenizer with --tokenizer.

perf_analyzer comes from the tritonclient[all]==2.51.0 wheel (PyPI's perf-analyzer>=2.58 needs glibc 2.38).
That binary links libb64.so.0d and libcudart.so.12 under names the nvidia-pytriton wheel ships with a hash
suffix; `link_libraries` points symlinks with the plain names at them when the system has none.
perf_analyzer reports no per-token latencies itself: they are computed from its --profile-export-file
(one timestamp per streamed response). Every request asks for exactly --max-tokens tokens (end_id -1,
min_length), so output tokens/s is completed requests x max_tokens / measured wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from bls.contract import BLS_MODEL

MODELS = ("ensemble", BLS_MODEL)
# tensorrt_llm_bls ends every stream with a summary response (finish reason, token counts), not a token.
SUMMARY_RESPONSE_MODELS = {BLS_MODEL}
NEEDED_LIBRARIES = {"libb64.so.0d": "libb64*.so.0d", "libcudart.so.12": "libcudart*.so.12*"}
PROMPT = "Write a long story about a lighthouse keeper and the sea."


@dataclass
class StreamSummary:
    tool: str
    model: str
    concurrency: int
    requests: int
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float
    itl_ms_p99: float
    output_tokens_per_s: float
    requests_per_s: float


# ---- environment --------------------------------------------------------------------------------------

def link_libraries(perf_venv: Path) -> Path:
    """A directory for LD_LIBRARY_PATH holding whatever perf_analyzer cannot find on this system."""
    links = perf_venv / "lib-links"
    links.mkdir(exist_ok=True)
    missing = [line.split()[0] for line in _ldd(perf_venv / "bin" / "perf_analyzer") if "not found" in line]
    search = [Path(p) / "nvidia_pytriton.libs" for p in {sysconfig.get_paths()["purelib"], *_site_packages(perf_venv)}]
    for name in missing:
        candidates = sorted(c for d in search if d.is_dir() for c in d.glob(NEEDED_LIBRARIES.get(name, name)))
        if not candidates:
            raise SystemExit(f"perf_analyzer needs {name}; none found in {search} (pip install nvidia-pytriton)")
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(candidates[0])
    return links


def _ldd(binary: Path) -> list[str]:
    env = dict(os.environ, LD_LIBRARY_PATH="")
    return subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env=env).stdout.splitlines()


def _site_packages(venv: Path) -> list[str]:
    return [str(p) for p in (venv / "lib").glob("python3*/site-packages")]


def tool_environment(perf_venv: Path) -> dict[str, str]:
    links = link_libraries(perf_venv).resolve()  # absolute: genai-perf runs in its own working directory
    env = dict(os.environ)
    # genai-perf runs perf_analyzer
    env["PATH"] = os.pathsep.join([str((perf_venv / "bin").resolve()), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(links), env.get("LD_LIBRARY_PATH")) if p)
    return env


@contextlib.contextmanager
def grpc_endpoint(url: str | None, repo: Path, log_path: Path) -> Iterator[str]:
    if url:
        yield url
        return
    from serving.tritonserver import TritonServer

    if not (repo / "ensemble").is_dir():
        raise SystemExit(f"{repo} is not a built model repository: run `make repo` or give --url")
    with TritonServer(repo.resolve(), log_path=log_path) as server:
        yield server.grpc_url


# ---- perf_analyzer ----------------------------------------------------------------------------------------

def perf_analyzer(args) -> list[StreamSummary]:
    env = tool_environment(args.perf_venv)
    out = args.out / "perf_analyzer"
    out.mkdir(parents=True, exist_ok=True)
    summaries = []
    with grpc_endpoint(args.url, args.repo, out / "tritonserver.log") as url:
        for model in args.models:
            data = out / f"{model}.input.json"
            data.write_text(json.dumps({"data": [{
                "text_input": [PROMPT], "max_tokens": [args.max_tokens], "min_length": [args.max_tokens],
                "end_id": [-1], "stream": [True],
            }]}))
            export = out / f"{model}.export.json"
            export.unlink(missing_ok=True)  # perf_analyzer refuses to overwrite it
            command = [
                "perf_analyzer", "-m", model, "-u", url, "-i", "grpc", "--streaming", "--async",
                "--input-data", str(data), "--concurrency-range", str(args.concurrency),
                "--request-count", str(args.requests), "--stability-percentage", "999",
                "--profile-export-file", str(export),
            ]  # no --warmup-request-count: with it, perf_analyzer 2.51 never finishes a streaming run here
            print("+ " + " ".join(command), flush=True)
            run = subprocess.run(command, env=env, capture_output=True, text=True)
            (out / f"{model}.stdout.txt").write_text(run.stdout + run.stderr)
            if run.returncode != 0:
                raise SystemExit(f"perf_analyzer failed on {model}:\n{run.stdout}\n{run.stderr}")
            summaries.append(summarise_export(export, model, args.concurrency, args.max_tokens))
    return summaries


def summarise_export(export: Path, model: str, concurrency: int, max_tokens: int) -> StreamSummary:
    """TTFT, inter-token latency and throughput from perf_analyzer's per-response timestamps (ns)."""
    experiment = json.loads(export.read_text())["experiments"][0]
    ttft, gaps, starts, ends = [], [], [], []
    for request in experiment["requests"]:
        times = request["response_timestamps"]
        if model in SUMMARY_RESPONSE_MODELS:
            times = times[:-1]
        if not times:
            continue
        ttft.append(times[0] - request["timestamp"])
        gaps += [b - a for a, b in pairwise(times)]
        starts.append(request["timestamp"])
        ends.append(times[-1])
    wall_s = (max(ends) - min(starts)) / 1e9
    return StreamSummary(
        tool="perf_analyzer", model=model, concurrency=concurrency, requests=len(ttft),
        ttft_ms_p50=_ms(np.percentile(ttft, 50)), ttft_ms_p99=_ms(np.percentile(ttft, 99)),
        itl_ms_p50=_ms(np.percentile(gaps, 50)), itl_ms_p99=_ms(np.percentile(gaps, 99)),
        output_tokens_per_s=round(len(ttft) * max_tokens / wall_s, 1), requests_per_s=round(len(ttft) / wall_s, 2),
    )


def _ms(nanoseconds: float) -> float:
    return round(float(nanoseconds) / 1e6, 1)


# ---- genai-perf ---------------------------------------------------------------------------------------------

def genai_perf(args) -> list[StreamSummary]:
    env = tool_environment(args.perf_venv)
    out = (args.out / "genai_perf").resolve()
    summaries = []
    with grpc_endpoint(args.url, args.repo, args.out / "genai-perf-tritonserver.log") as url:
        for model in args.models:
            artifacts = out / model
            command = [
                str((args.genai_venv / "bin" / "genai-perf").resolve()), "profile", "-m", model,
                "--endpoint-type", "kserve",
                "--backend", "tensorrtllm", "--streaming", "-u", url, "--tokenizer", str(args.tokenizer.resolve()),
                "--synthetic-input-tokens-mean", "32", "--synthetic-input-tokens-stddev", "0",
                # deterministic: min_length = max_tokens, so every request yields exactly max_tokens tokens
                "--output-tokens-mean", str(args.max_tokens), "--output-tokens-mean-deterministic",
                "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
                "--artifact-dir", str(artifacts),
            ]
            print("+ " + " ".join(command), flush=True)
            run = subprocess.run(command, env=env, capture_output=True, text=True, cwd=out.parent)
            artifacts.mkdir(parents=True, exist_ok=True)
            (artifacts / "console.txt").write_text(run.stdout + run.stderr)
            if run.returncode != 0:
                raise SystemExit(f"genai-perf failed on {model}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
            summaries.append(summarise_genai_perf(artifacts, model, args.concurrency))
    return summaries


def summarise_genai_perf(artifacts: Path, model: str, concurrency: int) -> StreamSummary:
    metrics = json.loads(next(artifacts.rglob("profile_export_genai_perf.json")).read_text())
    return StreamSummary(
        tool="genai-perf", model=model, concurrency=concurrency,
        requests=int(metrics["request_count"]["avg"]) if "request_count" in metrics else -1,
        ttft_ms_p50=round(metrics["time_to_first_token"]["p50"], 1),
        ttft_ms_p99=round(metrics["time_to_first_token"]["p99"], 1),
        itl_ms_p50=round(metrics["inter_token_latency"]["p50"], 1),
        itl_ms_p99=round(metrics["inter_token_latency"]["p99"], 1),
        output_tokens_per_s=round(metrics["output_token_throughput"]["avg"], 1),
        requests_per_s=round(metrics["request_throughput"]["avg"], 2),
    )


# ---- output -----------------------------------------------------------------------------------------------

def write_summary(summaries: list[StreamSummary], out: Path, name: str) -> None:
    header = ("| tool | model | concurrency | requests | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | output tok/s "
              "| req/s |")
    rows = [header, "|---|---|---|---|---|---|---|---|"] + [
        f"| {s.tool} | {s.model} | {s.concurrency} | {s.requests} | {s.ttft_ms_p50} / {s.ttft_ms_p99} | "
        f"{s.itl_ms_p50} / {s.itl_ms_p99} | {s.output_tokens_per_s} | {s.requests_per_s} |"
        for s in summaries
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text("\n".join(rows) + "\n")
    (out / f"{name}.json").write_text(json.dumps([asdict(s) for s in summaries], indent=2) + "\n")
    print("\n".join(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.perf_tools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="tool", required=True)
    for name in ("perf-analyzer", "genai-perf"):
        command = sub.add_parser(name)
        command.add_argument("--perf-venv", type=Path, default=Path("build/venv-perf"))
        command.add_argument("--url", help="host:grpc_port of a running server (default: start one on --repo)")
        command.add_argument("--repo", type=Path, default=Path("build/model_repository"))
        command.add_argument("--models", nargs="+", default=list(MODELS))
        command.add_argument("--concurrency", type=int, default=4)
        command.add_argument("--requests", type=int, default=40)
        command.add_argument("--max-tokens", type=int, default=32)
        command.add_argument("--out", type=Path, default=Path("build/perf"))
        if name == "genai-perf":
            command.add_argument("--genai-venv", type=Path, default=Path("build/venv-genai-perf"))
            command.add_argument("--tokenizer", type=Path, default=Path("build/assets/tokenizer"))
    args = parser.parse_args(argv)
    if args.tool == "perf-analyzer":
        write_summary(perf_analyzer(args), args.out, "perf_analyzer_summary")
    else:
        write_summary(genai_perf(args), args.out, "genai_perf_summary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
