"""`make lint`'s C++ half: every C++ file of the project (relay/, its tests, the benchmark's send_cpp backend and
C++ engine, tools/bench_engine/) compiled syntax-only by each C++ compiler here, g++ and clang++ (the 26.07 image
has clang++ only), with the warnings the relay is built with as errors (engine_build.repository.RELAY_WARNINGS).
Warnings only the optimizer finds come from the real builds, `make repo` and the bench (-O2, the same flags).

    python -m tools.lint_cpp
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine_build.repository import CXX_COMPILERS, PROJECT_ROOT, RELAY_WARNINGS, relay_include_dir

SOURCES = ("relay/*.cc", "relay/tests/*.cc", "tools/bench_models/*/*.cc", "tools/bench_engine/*.cc")


def compilers() -> list[str]:
    """g++ and clang++ where installed, and $CXX when it names another."""
    names = [*CXX_COMPILERS, *([os.environ["CXX"]] if os.environ.get("CXX") else [])]
    return [name for name in dict.fromkeys(names) if shutil.which(name)]


def check(compiler: str, source: Path) -> str | None:
    """The compiler's messages for `source`, or None when it compiles without a warning."""
    result = subprocess.run([compiler, "-fsyntax-only", "-std=c++17", *RELAY_WARNINGS, f"-I{relay_include_dir()}",
                             str(source)], capture_output=True, text=True)
    return None if result.returncode == 0 else result.stderr or f"exit {result.returncode}"


def main() -> int:
    found = compilers()
    if not found:
        print(f"lint: no C++ compiler ({' or '.join(CXX_COMPILERS)}) to check the C++ with: apt-get install g++ "
              "(or clang)", file=sys.stderr)
        return 1
    sources = sorted(source for pattern in SOURCES for source in PROJECT_ROOT.glob(pattern))
    jobs = [(compiler, source) for compiler in found for source in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [(job, messages) for job, messages in zip(jobs, pool.map(lambda job: check(*job), jobs), strict=True)
                    if messages is not None]
    for (compiler, source), messages in failures:
        print(f"{compiler} {source.relative_to(PROJECT_ROOT)}:\n{messages}", file=sys.stderr)
    if failures:
        return 1
    print(f"C++: {len(sources)} files ({', '.join(SOURCES)}), no warning from {' and '.join(found)} "
          f"({' '.join(RELAY_WARNINGS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
