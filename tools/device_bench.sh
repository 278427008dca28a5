#!/usr/bin/env bash
# `make bench --only streaming` for two source trees on the 16-core GPU host (the `device` tool), alternated in one
# call so that the host's drift (up to 2x between hours, docs/benchmarks.md) falls on both alike.
#
# Two steps (docs/benchmarks.md, "How the 16-core figures are taken"):
#
#   here:    bash tools/device_bench.sh prepare BEFORE_REV [AFTER_REV]
#            writes .devbench/ in the checkout the device tool sends (the repository's main worktree, also from
#            another worktree: the tool sends the session's checkout), ignored through .git/info/exclude: Triton
#            2.51 from the nvidia-pytriton wheel trimmed to the server, the Python backend and its 3.12 stub (the
#            host has Python 3.12, no package index); the packages the models need in the host's venv (numpy 1.26:
#            2.51's Python backend breaks with numpy 2; transformers 4.57.3 and its hub; tokenizers; psutil; xgrammar
#            0.2.8 and what it imports: the engine builds its grammar compiler at load); the
#            tokenizer and the tiny target's config.json (the synthetic engine loads no weights); and
#            `git archive` tarballs of BEFORE_REV, and of AFTER_REV where given (none: the sent checkout itself is
#            "after"). About 50 MiB of the 64 a call may carry.
#   device:  run(carry=[".devbench"], command="bash .devbench/device_bench.sh run .devbench [BUDGET_S] [-- BENCH ARGS]")
#            (`prepare` puts the after tree's own copy of this script there). Sets net.core.wmem_default, installs the packages,
#            builds each tree's default repository on the host (`python -m engine_build assemble --synthetic`, so
#            the instance counts are the host's), then runs `python -m tools.bench --only streaming` with each
#            tree's own code, before / after / after / before / ... (DEVBENCH_ORDER), as long as the next run fits in BUDGET_S
#            (default 540 s; one call may run 600). Each run's tables go to $OUT/runN-<tree>.txt as it ends, the
#            set-up's log to $OUT/setup.log.
#
# BENCH ARGS default to --quick --streams 64,256,1024 --paced-streams 256 --only openai: the C++ bench engine
# (tools/bench_engine, compiled there), section streaming's throughput runs at 64/256/1024 streams (engine alone, the
# BLS, the ensemble), the interval runs, 256 streams paced like a GPU, the stub send floor, and section openai (the
# OpenAI API, its default workers, against the BLS over gRPC; its packages are in the payload). For one tree
# (`DEVBENCH_ORDER=after`) as the issue-49 figures were taken; for a before / after pair of trees that both have
# it. The Python engine as before: `-- --quick --engine python --engine-instances 6 --paced-streams 64`, ~210 s a
# run on the 16-core host, so one call (set-up ~45 s) holds one before / after pair; a second call gives the pair in the other order with
# `DEVBENCH_ORDER="after before" bash .devbench/device_bench.sh run .devbench`. A tree whose tools.bench still imports every section (before 09d727c) runs
# the section through a driver written here (run_section.py), with its own client (one process, threads).
set -euo pipefail

PAYLOAD_NAME=.devbench

prepare() {
    local before=$1 after=${2:-}
    local root payload site
    root=$(git rev-parse --path-format=absolute --git-common-dir)/..
    root=$(cd "$root" && pwd)
    payload=$root/$PAYLOAD_NAME
    grep -qxF "/$PAYLOAD_NAME/" "$root/.git/info/exclude" 2>/dev/null || echo "/$PAYLOAD_NAME/" >>"$root/.git/info/exclude"
    rm -rf "$payload" && mkdir -p "$payload"
    local python=${VENV:-$root/.venv}/bin/python
    site=$("$python" -c 'import pathlib, pytriton; print(pathlib.Path(pytriton.__path__[0]).parent)' 2>/dev/null ||
           "$python" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("pytriton").submodule_search_locations[0]).parent)')
    local stage
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' RETURN
    # Triton: the server, the Python backend with the 3.12 stub in place, the wheel's libraries they load.
    local server=pytriton/tritonserver
    mkdir -p "$stage/site/$server/bin" "$stage/site/$server/backends/python" "$stage/site/nvidia_pytriton.libs"
    cp "$site/$server/bin/tritonserver" "$stage/site/$server/bin/"
    cp "$site/$server/backends/python/libtriton_python.so" "$site/$server/backends/python/triton_python_backend_utils.py" \
       "$site/$server/python_backend_stubs/3.12/triton_python_backend_stub" "$stage/site/$server/backends/python/"
    local library
    for library in $( (ldd "$site/$server/bin/tritonserver"; ldd "$site/$server/backends/python/libtriton_python.so") |
                      awk '/nvidia_pytriton.libs/ {print $1}' | sort -u); do
        cp "$site/nvidia_pytriton.libs/$library" "$stage/site/nvidia_pytriton.libs/"
    done
    tar -C "$stage/site" -cf - . | xz -6 -T0 >"$payload/triton.tar.xz"
    # The host's venv: numpy and transformers unpacked and xz'd (half their wheels' size), the small ones as wheels.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
        --platform manylinux2010_x86_64 -d "$stage/wheels" \
        numpy==1.26.4 transformers==4.57.3 tokenizers==0.22.1 huggingface_hub==0.36.2 psutil==7.1.3 \
        xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 \
        typing_inspection==0.4.5 \
        fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 prometheus_client==0.23.1 \
        tritonclient==2.51.0 protobuf==4.25.9 python-rapidjson==1.25 sniffio==1.3.1 opentelemetry-api==1.45.2
    mkdir -p "$stage/unpacked" "$payload/wheels"
    # tritonclient without its 40 MB of perf_analyzer binaries (the API and the bench need its Python only).
    (cd "$stage/unpacked" && for wheel in "$stage"/wheels/numpy-*.whl "$stage"/wheels/transformers-*.whl; do
        unzip -q -o "$wheel"; done && rm -rf numpy/*/tests numpy/tests &&
        unzip -q -o "$stage"/wheels/tritonclient-*.whl 'tritonclient-*.data/purelib/*' 'tritonclient-*.dist-info/*' &&
        mv tritonclient-*.data/purelib/tritonclient . && rm -rf tritonclient-*.data &&
        tar -cf - . | xz -6 -T0 >"$payload/packages.tar.xz")
    find "$stage/wheels" -name "*.whl" ! -name "numpy-*" ! -name "transformers-*" ! -name "tritonclient-*" \
        -exec cp {} "$payload/wheels/" \;
    # The tokenizer and the target's config.json, from `make repo`'s assets.
    mkdir -p "$stage/assets/target"
    cp -r "$root/build/assets/tokenizer" "$stage/assets/"
    cp "$root/build/assets/tiny-target-awq/config.json" "$stage/assets/target/"
    tar -C "$stage" -cf - assets | xz -6 -T0 >"$payload/assets.tar.xz"
    # The trees.
    git -C "$root" archive --format=tar.gz -o "$payload/before.tar.gz" "$before"
    if [ -n "$after" ]; then  # this script as the after tree has it: the device runs that one
        git -C "$root" archive --format=tar.gz -o "$payload/after.tar.gz" "$after"
        git -C "$root" archive --format=tar "$after" tools/device_bench.sh | tar -xOf - >"$payload/device_bench.sh"
    else
        cp "$0" "$payload/device_bench.sh"
    fi
    echo "$before${after:+ -> $after}" >"$payload/trees"
    du -sh "$payload"
}

run() {
    local payload budget_s=540
    payload=$(cd "$1" && pwd)
    shift
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then budget_s=$1; shift; fi
    [ "${1:-}" = "--" ] && shift
    local bench_args=("$@")
    [ ${#bench_args[@]} -gt 0 ] || bench_args=(--quick --streams 64,256,1024 --paced-streams 256 --only openai)
    local began=$SECONDS out=${OUT:-/tmp/devbench-out}
    mkdir -p "$out"
    local python=/opt/torch/.venv/bin/python
    {
        echo "host: $(nproc) cores, $(uname -r), $(date -u +%FT%TZ); trees: $(cat "$payload/trees")"
        echo "bench args: ${bench_args[*]}"
        sysctl -w net.core.wmem_default=4194304
        # The packages: the preinstalled numpy 2, transformers 5 and huggingface_hub 1 out, ours in.
        local purelib
        purelib=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$python" -m pip uninstall -q -y numpy transformers huggingface_hub tokenizers psutil || true
        xz -dc "$payload/packages.tar.xz" | tar -xf - -C "$purelib"
        "$python" -m pip install -q --no-index --no-deps --no-compile "$payload"/wheels/*.whl
        rm -rf /tmp/devbench && mkdir -p /tmp/devbench/site /tmp/devbench/trees
        xz -dc "$payload/triton.tar.xz" | tar -xf - -C /tmp/devbench/site
        xz -dc "$payload/assets.tar.xz" | tar -xf - -C /tmp/devbench
        "$python" -c 'import importlib.metadata, numpy, transformers, tokenizers, psutil, xgrammar; print("numpy", numpy.__version__, "transformers", transformers.__version__, "xgrammar", importlib.metadata.version("xgrammar"))'
        "$python" -c 'import torch; print("torch", torch.__version__, torch.zeros(2, dtype=torch.int32).numpy())' || true
        command -v g++ || echo "no g++: no relay, the section measures the in-process transport"
    } >"$out/setup.log" 2>&1 || { cat "$out/setup.log"; return 1; }
    # The bench process finds tritonserver as the wheel's (serving.tritonserver locates, never imports, pytriton);
    # the text models need only tokenizers (bls.text.without_torch), the stand-in engine imports torch itself.
    # transformers 4.57 with this host's torch 2.11 fails to import its generation module: the bench process (which
    # builds the variants' xgrammar tokenizer info) and the stubs (which inherit its environment) go without.
    export PYTHONPATH=/tmp/devbench/site PYTHONUNBUFFERED=1 USE_TORCH=0 USE_TF=0 USE_FLAX=0 USE_JAX=0 \
        PATH=/opt/torch/.venv/bin:$PATH
    write_section_driver /tmp/devbench/run_section.py
    local tree
    for tree in before after; do
        local dir=/tmp/devbench/trees/$tree
        mkdir -p "$dir"
        if [ -f "$payload/$tree.tar.gz" ]; then
            tar -xzf "$payload/$tree.tar.gz" -C "$dir"
        else  # the sent checkout is the after tree
            tar --exclude="./$PAYLOAD_NAME" --exclude=./build --exclude=./.venv -cf - . | tar -xf - -C "$dir"
        fi
        (cd "$dir" && USE_TORCH=0 "$python" -m engine_build assemble --engine embedded --synthetic \
            --repo build/model_repository --tokenizer /tmp/devbench/assets/tokenizer --target /tmp/devbench/assets/target) \
            >>"$out/setup.log" 2>&1 || { tail -40 "$out/setup.log"; return 1; }
    done
    echo "set-up: $((SECONDS - began)) s" | tee -a "$out/setup.log"
    # before, after, after, before, before, after: each pair in both orders.
    local order=(${DEVBENCH_ORDER:-before after after before before after}) longest=0 n=0
    for tree in "${order[@]}"; do
        local left=$((budget_s - (SECONDS - began)))
        if [ $n -gt 0 ] && [ $left -lt $((longest + longest / 5)) ]; then
            echo "stopped after $n runs: $left s left, a run took up to $longest s"; break
        fi
        n=$((n + 1))
        local run_began=$SECONDS
        local bench=(-m tools.bench --only streaming)
        # A tree whose tools.bench imports every section's module (before 09d727c) needs the other sections'
        # packages (tritonclient, ...), which this host lacks: the section's run() through the driver instead.
        grep -q "import_module" "/tmp/devbench/trees/$tree/tools/bench.py" || bench=(/tmp/devbench/run_section.py)
        (cd "/tmp/devbench/trees/$tree" && timeout $((left > 30 ? left - 10 : 30)) "$python" "${bench[@]}" \
            --repo build/model_repository --out "/tmp/devbench/out-$n" "${bench_args[@]}") \
            >"$out/run$n-$tree.txt" 2>&1 || {
            echo "run $n ($tree) failed: $out/run$n-$tree.txt"
            # The server's errors (a model that failed to load says why only in its log).
            { echo "--- errors in the server logs:"; grep -hvE "^I[0-9]{4} |^W[0-9]{4} |^[|+]" /tmp/devbench/out-$n/logs/*.log |
                grep -vE "^\s*$" | head -80; } >>"$out/run$n-$tree.txt" 2>&1 || true
        }
        local took=$((SECONDS - run_began))
        [ $took -gt $longest ] && longest=$took
        echo "run $n ($tree): $took s"
    done
}

write_section_driver() {
    cat >"$1" <<'PYTHON'
"""Section streaming of a tree whose tools.bench imports every section: its run() and the table as tools.bench
prints it, with tools.bench's options for the section (those the tree's BenchContext has)."""
import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
from tools import bench_streaming  # noqa: E402
from tools.bench_common import BenchContext, format_value  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--repo", type=Path, required=True)
parser.add_argument("--out", type=Path, required=True)
parser.add_argument("--quick", action="store_true")
parser.add_argument("--engine-instances", type=int, default=1)
parser.add_argument("--bls-instances", type=int)
parser.add_argument("--engine-step-ms", type=float, default=0.0)
parser.add_argument("--paced-streams", default="16,64,256")
parser.add_argument("--client-processes", type=int)
args = parser.parse_args()
options = dict(repo=args.repo, work_dir=args.out.resolve(), quick=args.quick, engine_instances=args.engine_instances,
               bls_instances=args.bls_instances, engine_step_ms=args.engine_step_ms,
               paced_streams=tuple(int(n) for n in args.paced_streams.split(",")))
if args.client_processes:
    options["client_processes"] = args.client_processes
fields = {field.name for field in dataclasses.fields(BenchContext)}
ctx = BenchContext(**{name: value for name, value in options.items() if name in fields})
began = time.monotonic()
try:
    rows = bench_streaming.run(ctx)
finally:
    ctx.stop_server()
cells = [("metric", "target", "measured", "unit", "status")] + [
    (row.metric, str(row.target) if row.target else "-", format_value(row.measured), row.unit, row.status) for row in rows]
widths = [max(len(line[i]) for line in cells) for i in range(5)]
print(f"== 2. streaming vs the engine floor (run_section.py) ({time.monotonic() - began:.0f} s) ==")
for n, line in enumerate(cells):
    print("  ".join(v.rjust(w) if i in (1, 2) else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths))).rstrip())
    if n == 0:
        print("  ".join("-" * w for w in widths))
PYTHON
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 prepare BEFORE_REV [AFTER_REV] | run PAYLOAD_DIR [BUDGET_S] [-- BENCH ARGS]" >&2; exit 2 ;;
esac
