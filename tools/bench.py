"""`make bench`: the benchmark tables, target and measured side by side.

    python -m tools.bench --repo build/model_repository [--only SECTION ...] [--quick]

Sections (each runnable alone with --only):
  pipeline     preprocessing throughput, latency the ensemble adds over the bare engine (synthetic engine)
  streaming    BLS and ensemble vs the engine-alone floor at 1/16/64/256/1024 streams, one response per token (the
               C++ bench engine, tools/bench_engine, unless --engine python)
  detokenizer  per-token cost of incremental detokenization vs re-decoding everything (no server)
  bls          tensorrt_llm_bls streams: text == non-streamed text, flat per-token CPU over 4,096 tokens
  speculative  draft-target speculative decoding on the real default repository
  ngram        n-gram speculative decoding (prompt lookup) on input-grounded prompts (embedded engine, in-process)
  awq          AWQ int4 target vs the unquantised model: greedy agreement and logit error (no server)
  guided       guided decoding: first token and tok/s guided vs unguided, grammar compile cold and cached, the
               per-token mask cost (real default repository, and in-process)
  openai       streamed chat through the OpenAI-compatible API vs straight to tensorrt_llm_bls over gRPC at --streams
               (from 16), and the first-token latency it adds with the engine paced like a GPU (synthetic engine)
  metrics      what the request metrics and the engine's nv_trt_llm gauges cost per generated token (a bench model)
  lora         LoRA adapters on the embedded engine: a batch with mixed adapters against one without (in-process)
  aiperf       NVIDIA's AIPerf, unchanged, against the OpenAI-compatible API beside the section's own client, same
               load (synthetic engine paced like a GPU; AIPerf from its own venv, --aiperf-venv)

Tables go to stdout; the same rows go to <out>/results.json (a run of some sections updates only those).
Speed goals are measured here and never asserted in tests. --quick shortens every section for development:
its numbers are noisier and not the ones to report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

# Before torch is imported (sections load it in-process): busy-waiting OpenMP threads would take the
# cores from the server being measured.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tools.bench_common import BenchContext, Row, default_client_processes, format_value

# The C++ engine's least step in the throughput runs: 256 streams at 2 ms a step are 128k tok/s, above the 100k the
# BLS is to carry (issue 49), while no GPU steps this fast (Llama 3 8B on an H100: several ms at batch 1).
CPP_THROUGHPUT_STEP_MS = 2.0


@dataclass(frozen=True)
class Section:
    """A section's module is tools.bench_<name>, imported only when the section runs: `--only streaming` needs
    no package of the other sections (a GPU host's bare Python runs it)."""

    name: str
    title: str

    def run(self, ctx: BenchContext) -> list[Row]:
        return importlib.import_module(f"tools.bench_{self.name}").run(ctx)


SECTIONS = (
    Section("pipeline", "1. preprocessing and ensemble (synthetic engine)"),
    Section("streaming", "2. streaming vs the engine floor (engine stand-in per --engine, one response per token)"),
    Section("detokenizer", "3. detokenizer: per-token cost vs output length"),
    Section("bls", "4. tensorrt_llm_bls streams: correctness and flat cost (synthetic engine)"),
    Section("speculative", "5. speculative decoding (real default repository)"),
    Section("ngram", "5b. n-gram speculative decoding on input-grounded prompts (embedded engine, in-process)"),
    Section("awq", "6. AWQ int4 quality vs the unquantised model"),
    Section("guided", "7. guided decoding: compile, mask cost, guided vs unguided (real default repository)"),
    Section("openai", "8. the OpenAI-compatible API vs tensorrt_llm_bls over gRPC (engine stand-in per --engine)"),
    Section("metrics", "9. metrics: cost per generated token (bench model, production classes)"),
    Section("lora", "10. LoRA adapters: mixed-adapter batch vs none (embedded engine, in-process)"),
    Section("aiperf", "11. NVIDIA's AIPerf vs the section's own client through the OpenAI-compatible API (synthetic "
            "engine paced like a GPU)"),
)


def format_table(title: str, rows: list[Row], seconds: float) -> str:
    header = ("metric", "target", "measured", "unit", "status")
    cells = [header] + [
        (row.metric, str(row.target) if row.target else "-", format_value(row.measured), row.unit, row.status)
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]

    def line(values) -> str:
        return "  ".join(value.rjust(width) if i in (1, 2) else value.ljust(width)
                         for i, (value, width) in enumerate(zip(values, widths, strict=True))).rstrip()

    out = [f"== {title} ({seconds:.0f} s) ==", line(header), line("-" * w for w in widths)]
    out += [line(values) for values in cells[1:]]
    out += [f"   note: {row.metric}: {row.note}" for row in rows if row.note]
    return "\n".join(out)


def write_results(path: Path, results: dict, quick: bool) -> None:
    """Merge into an existing results file, so that `--only` runs refresh their sections only."""
    existing = json.loads(path.read_text()) if path.is_file() else {}
    sections = existing.get("sections", {})
    sections.update(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "sections": sections,
    }, indent=2) + "\n")


def _concurrencies(text: str) -> tuple[int, ...]:
    """`64,256` -> (64, 256); argparse reports a ValueError as an invalid value of the option."""
    values = tuple(int(n) for n in text.split(","))
    if any(n < 1 for n in values):
        raise ValueError(text)
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, default=Path("build/model_repository"), help="the default repository")
    parser.add_argument("--only", action="append", choices=[s.name for s in SECTIONS], help="run only this section")
    parser.add_argument("--quick", action="store_true", help="short runs for development (noisy numbers)")
    parser.add_argument("--out", type=Path, default=Path("build/bench"), help="variants, server logs, results.json")
    parser.add_argument("--engine-instances", type=int, default=1,
                        help="section streaming, throughput runs: instances of the synthetic engine (many-core "
                             "hosts: enough that the engine stand-in is not the bottleneck; the paced runs use one, "
                             "as a GPU engine steps every stream at once)")
    parser.add_argument("--bls-instances", type=int,
                        help="section streaming: BLS instances (default: the repository's)")
    parser.add_argument("--engine-step-ms", type=float,
                        help="section streaming: the engine's least step time in the throughput runs. Default: "
                             f"{CPP_THROUGHPUT_STEP_MS} ms for --engine cpp (unpaced, it sends faster than Triton's "
                             "HTTP frontend takes responses, which then drops them: docs/operations.md, \"HTTP "
                             "responses dropped under load\"), 0 for --engine python (as fast as the CPU lets it, "
                             "running ahead of its own sending; any value > 0 also makes it wait for its sending)")
    parser.add_argument("--paced-streams", type=_concurrencies, default=(16, 64, 256),
                        help="section streaming: concurrencies of the runs with the engine paced like a GPU, comma-"
                             "separated (default 16,64,256: 256 streams are 6,400 tok/s at 40 ms a step, more than a "
                             "2-core host carries through the ensemble)")
    parser.add_argument("--streams", type=_concurrencies, default=(1, 16, 64, 256, 1024),
                        help="sections streaming and openai: concurrencies of the throughput runs, comma-separated "
                             "(default 1,16,64,256,1024)")
    parser.add_argument("--engine", choices=("cpp", "python"), default="cpp",
                        help="sections streaming and openai: the engine stand-in, cpp (tools/bench_engine, compiled "
                             "here: one step thread sends every stream's response, as TensorRT-LLM's executor does) or "
                             "python (the synthetic embedded engine behind its relay; --engine-instances of it)")
    parser.add_argument("--client-processes", type=int, default=default_client_processes(),
                        help="the load's client processes (threads spread over them; one Python process tops out near "
                             "a core); default one per 4 cores: %(default)s here")
    parser.add_argument("--aiperf-venv", type=Path, default=Path("build/venv-aiperf"),
                        help="section aiperf: the venv holding NVIDIA's AIPerf (`make bench` makes it)")
    args = parser.parse_args(argv)
    if not (args.repo / "ensemble").is_dir():
        raise SystemExit(f"{args.repo} is not a built model repository: run `make repo` first")

    ctx = BenchContext(repo=args.repo, work_dir=args.out.resolve(), quick=args.quick,
                       engine_instances=args.engine_instances, bls_instances=args.bls_instances,
                       engine_step_ms=(args.engine_step_ms if args.engine_step_ms is not None
                                       else CPP_THROUGHPUT_STEP_MS if args.engine == "cpp" else 0.0),
                       paced_streams=args.paced_streams, streams=args.streams,
                       engine=args.engine,
                       client_processes=args.client_processes, aiperf_venv=args.aiperf_venv)
    results: dict[str, dict] = {}
    failed = []
    try:
        for section in SECTIONS:
            if args.only and section.name not in args.only:
                continue
            began = time.monotonic()
            try:
                rows = section.run(ctx)
            except Exception:  # noqa: BLE001 - one broken section must not hide the others' numbers
                failed.append(section.name)
                print(f"== {section.title}: FAILED ==\n{traceback.format_exc()}", flush=True)
                continue
            seconds = time.monotonic() - began
            print(format_table(section.title, rows, seconds) + "\n", flush=True)
            results[section.name] = {"title": section.title, "quick": args.quick, "seconds": round(seconds, 1),
                                     "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                     "rows": [row.as_dict() for row in rows]}
    finally:
        ctx.stop_server()
        write_results(ctx.work_dir / "results.json", results, args.quick)
    print(f"results: {ctx.work_dir / 'results.json'}")
    if failed:
        print(f"failed sections: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
