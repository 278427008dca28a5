"""`make lint`'s C++ half: every file of relay/ (the library and its tests) compiled syntax-only by each C++ compiler
here, g++ and clang++ (the 26.07 image has clang++ only), with the warnings the relay is built with as errors
(engine_build.repository.RELAY_WARNINGS). Warnings only the optimizer finds come from the real build, `make repo`
(-O2, the same flags).

    python -m tools.lint_relay
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine_build.repository import CXX_COMPILERS, RELAY_DIR, RELAY_WARNINGS, relay_include_dir


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
        print(f"lint: no C++ compiler ({' or '.join(CXX_COMPILERS)}) to check relay/ with: apt-get install g++ "
              "(or clang)", file=sys.stderr)
        return 1
    sources = sorted([*RELAY_DIR.glob("*.cc"), *RELAY_DIR.glob("tests/*.cc")])
    jobs = [(compiler, source) for compiler in found for source in sources]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [(job, messages) for job, messages in zip(jobs, pool.map(lambda job: check(*job), jobs), strict=True)
                    if messages is not None]
    for (compiler, source), messages in failures:
        print(f"{compiler} {source.relative_to(RELAY_DIR.parent)}:\n{messages}", file=sys.stderr)
    if failures:
        return 1
    print(f"relay/: {len(sources)} files, no warning from {' and '.join(found)} ({' '.join(RELAY_WARNINGS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
