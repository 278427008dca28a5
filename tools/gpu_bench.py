"""`make gpu-bench`: what the built TensorRT-LLM engine and the served models deliver on your GPU.

    python -m tools.gpu_bench --repo build/model_repository [--concurrency 1 16 64 256]

Run it in the 26.07 TensorRT-LLM container after `make repo ENGINE=trtllm`; it was never run in this
repository's development (no GPU there). Two measurements:

1. TensorRT-LLM's own `trtllm-bench throughput --backend tensorrt --engine_dir ...` on the built engine, with a
   synthetic dataset of fixed input/output lengths written here in trtllm-bench's JSON-lines format
   ({"task_id", "input_ids", "output_tokens"}), at each concurrency: the engine alone.
2. genai-perf (the `make genai-perf` venv) against the served `ensemble` and `tensorrt_llm_bls`, streaming,
   at each concurrency: what a client gets through Triton and our Python models.

Output tok/s, time to first token and inter-token latency are printed beside the seeds' figures.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

from engine_build.repository import read_manifest

# Figures of the seed documents, for comparison (not measured here).
SEEDS = (
    "Llama 3 8B fp16 at batch 128 on one A100-40GB: 4,500 output tok/s",
    "Llama 3.1 8B FP8 on one H100 (NVIDIA's trtllm-bench tables): 3,500 to 29,000 output tok/s by input/output length",
)
WORKLOADS = ((128, 128), (128, 2048), (2048, 128))  # (input tokens, output tokens)
REQUESTS = 512
# Lines of trtllm-bench's performance overview that carry the figures compared here.
TRTLLM_BENCH_FIGURES = re.compile(r"(Output Throughput|time-to-first-token|time-per-output-token|Request Throughput)"
                                  r"[^:]*:\s*([0-9.]+)", re.IGNORECASE)


def write_dataset(tokenizer_dir: Path, input_len: int, output_len: int, path: Path) -> Path:
    """REQUESTS prompts of exactly input_len token ids (text from the tokenizer's own vocabulary)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rng = random.Random(0)
    special = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(min(len(tokenizer), 128000)) if i not in special]
    with path.open("w") as out:
        for task in range(REQUESTS):
            ids = [rng.choice(ordinary) for _ in range(input_len)]
            out.write(json.dumps({"task_id": task, "input_ids": ids, "output_tokens": output_len}) + "\n")
    return path


def trtllm_bench(manifest: dict, repo: Path, dataset: Path, concurrency: int) -> dict[str, float]:
    command = ["trtllm-bench", "--model", Path(manifest["tokenizer_dir"]).name, "--model_path",
               manifest["tokenizer_dir"], "throughput", "--backend", "tensorrt",
               "--engine_dir", str(repo / "tensorrt_llm" / "1"), "--dataset", str(dataset),
               "--concurrency", str(concurrency)]
    print("+ " + " ".join(command), flush=True)
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    print(run.stdout[-4000:], flush=True)
    if run.returncode != 0:
        raise SystemExit(f"trtllm-bench failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return {name: float(value) for name, value in TRTLLM_BENCH_FIGURES.findall(run.stdout)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=Path("build/model_repository"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--out", type=Path, default=Path("build/gpu-bench"))
    parser.add_argument("--genai-venv", type=Path, default=Path("build/venv-genai-perf"))
    parser.add_argument("--perf-venv", type=Path, default=Path("build/venv-perf"))
    args = parser.parse_args(argv)

    manifest = read_manifest(args.repo)
    if manifest.get("engine") != "trtllm" or not manifest.get("engines_built", True):
        raise SystemExit(f"{args.repo} holds no built TensorRT-LLM engine: run `make repo ENGINE=trtllm HF_MODEL=...` "
                         "(without DRY_RUN) on the GPU box first")
    if shutil.which("trtllm-bench") is None:
        raise SystemExit("trtllm-bench is not on PATH: run this in nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3")
    args.out.mkdir(parents=True, exist_ok=True)

    rows = []
    for input_len, output_len in WORKLOADS:
        dataset = write_dataset(Path(manifest["tokenizer_dir"]), input_len, output_len,
                                args.out / f"dataset-{input_len}-{output_len}.jsonl")
        for concurrency in args.concurrency:
            figures = trtllm_bench(manifest, args.repo, dataset, concurrency)
            rows.append((f"trtllm-bench {input_len}/{output_len}", concurrency, figures))

    from serving.tritonserver import TritonServer
    from tools import perf_tools

    with TritonServer(args.repo.resolve(), log_path=args.out / "tritonserver.log") as server:
        summaries = []
        for concurrency in args.concurrency:
            summaries += perf_tools.genai_perf(argparse.Namespace(
                url=server.grpc_url, repo=args.repo, models=list(perf_tools.MODELS), concurrency=concurrency,
                requests=max(2 * concurrency, 32), max_tokens=256, perf_venv=args.perf_venv,
                genai_venv=args.genai_venv, tokenizer=Path(manifest["tokenizer_dir"]), out=args.out))
    rows += [(f"genai-perf {s.model}", s.concurrency, {
        "Output Throughput (tokens/sec)": s.output_tokens_per_s, "time-to-first-token p50 (ms)": s.ttft_ms_p50,
        "inter-token latency p50 (ms)": s.itl_ms_p50}) for s in summaries]

    print("\n== GPU benchmark ==")
    for label, concurrency, figures in rows:
        cells = ", ".join(f"{name}: {value:,.1f}" for name, value in figures.items())
        print(f"{label:<38} concurrency {concurrency:>3}: {cells}")
    print("\nSeeds' figures, for comparison:\n  " + "\n  ".join(SEEDS))
    (args.out / "gpu_bench.json").write_text(json.dumps(
        [{"what": label, "concurrency": c, "figures": f} for label, c, f in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
