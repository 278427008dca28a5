"""The Debian packages `make test` needs beyond the README's prerequisites (Python 3.11+, g++, make, git), each proven
by what the tests do with it, not by a command's presence (`make system-packages`; `make test` runs it first).

A fresh Debian 12 machine once had `clang++` after `apt-get install --no-install-recommends clang` and still failed
`make test`: clang's sanitizer runtime is a separate package (`libclang-rt-dev`), so the rehearsal's ASan build of the
relay's frame test could not link. Hence every capability here runs the real thing (compile, link and run a
sanitized program with each compiler; promtool runs a rule test; the distribution's python3 makes a venv; its
libpython loads), installs the packages of whatever fails (as root, with apt-get), and checks again.

Package names are the same on Debian 12 (bookworm) and 13 (trixie): `clang`, `libclang-rt-dev` (the unversioned
name of the default clang's runtime, libclang-rt-14-dev / -19-dev), `g++`, `prometheus`, `python3-venv`,
`iproute2`, and `libpythonX.Y` for the distribution's python3 X.Y.

    python3 tools/system_packages.py             # make test's: exit 0 when all work (installing what is missing)
    python3 tools/system_packages.py --serving   # make serve's (the set-up runs it): the Python backend's stub

Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DISTRIBUTION_PYTHON = "/usr/bin/python3"

# Exercises what the sanitizers instrument (heap, the C++ library, integer arithmetic) and prints one word.
SANITIZED_PROGRAM = r"""
#include <cstdio>
#include <string>
#include <vector>
int main(int argc, char**) {
    std::vector<std::string> words(static_cast<size_t>(argc) + 1, "ok");
    int total = 0;
    for (const auto& word : words) total += static_cast<int>(word.size());
    std::printf("%s %d\n", words.back().c_str(), total);
    return 0;
}
"""
# The same runtime must also catch a fault: a heap overflow has to end in an AddressSanitizer report.
FAULTY_PROGRAM = r"""
#include <cstdlib>
int main(int argc, char**) {
    int* values = static_cast<int*>(std::malloc(4 * sizeof(int)));
    values[argc + 3] = 1;  // one past the end
    int last = values[argc + 3];
    std::free(values);
    return last;
}
"""
# The relay's own link flags (engine_build/repository.py relay_compile_command): a shared library with the C++
# runtime linked in statically, as `make repo` builds it with either compiler.
SHARED_LIBRARY = """#include <string>
extern "C" int relay_probe() { return static_cast<int>(std::string("ok").size()); }
"""
PROMTOOL_RULES = """groups:
  - name: probe
    rules:
      - record: probe:up:sum
        expr: sum(up)
"""
PROMTOOL_TEST = """rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="a"}'
        values: '1 1'
      - series: 'up{job="b"}'
        values: '1 0'
    promql_expr_test:
      - expr: probe:up:sum
        eval_time: 1m
        exp_samples:
          - labels: 'probe:up:sum'
            value: 1
"""


@dataclass(frozen=True)
class Capability:
    what: str  # what the tests do with it
    packages: tuple[str, ...]  # Debian packages that provide it
    check: Callable[[Path], str | None]  # None when it works, else what failed


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


def _compiler_check(compiler: str) -> Callable[[Path], str | None]:
    def check(work: Path) -> str | None:
        if shutil.which(compiler) is None:
            return f"{compiler}: not found"
        (work / "probe.cc").write_text(SANITIZED_PROGRAM)
        (work / "faulty.cc").write_text(FAULTY_PROGRAM)
        (work / "library.cc").write_text(SHARED_LIBRARY)
        sanitize = ["-std=c++17", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        built = _run([compiler, *sanitize, "-o", "probe", "probe.cc"], work)
        if built.returncode != 0:
            return f"{compiler} cannot link a program with -fsanitize=address,undefined:\n{built.stderr.strip()}"
        ran = _run(["./probe"], work)
        if ran.returncode != 0 or ran.stdout.strip() != "ok 4":
            return f"{compiler}'s sanitized program did not run (exit {ran.returncode}):\n{ran.stderr.strip()}"
        built = _run([compiler, *sanitize, "-o", "faulty", "faulty.cc"], work)
        caught = built.returncode == 0 and "AddressSanitizer: heap-buffer-overflow" in _run(["./faulty"], work).stderr
        if not caught:
            return f"{compiler}'s AddressSanitizer did not report a heap overflow"
        linked = _run([compiler, "-std=c++17", "-O2", "-shared", "-fPIC", "-static-libstdc++", "-static-libgcc",
                       "-o", "librelay_probe.so", "library.cc"], work)
        if linked.returncode != 0:
            return f"{compiler} cannot link a shared library with -static-libstdc++:\n{linked.stderr.strip()}"
        return None

    return check


def _promtool_check(work: Path) -> str | None:
    if shutil.which("promtool") is None:
        return "promtool: not found"
    (work / "rules.yaml").write_text(PROMTOOL_RULES)
    (work / "rules_test.yaml").write_text(PROMTOOL_TEST)
    tested = _run(["promtool", "test", "rules", "rules_test.yaml"], work)
    return None if tested.returncode == 0 else f"promtool test rules failed:\n{tested.stdout}{tested.stderr}"


def _distribution_python_version() -> str | None:
    if not os.access(DISTRIBUTION_PYTHON, os.X_OK):
        return None
    printed = subprocess.run([DISTRIBUTION_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
    return printed.stdout.strip() or None


def _venv_check(work: Path) -> str | None:
    if _distribution_python_version() is None:
        return f"{DISTRIBUTION_PYTHON}: not found"
    made = _run([DISTRIBUTION_PYTHON, "-m", "venv", str(work / "venv")], work)
    if made.returncode != 0:
        return f"{DISTRIBUTION_PYTHON} -m venv failed:\n{made.stderr.strip() or made.stdout.strip()}"
    pip = _run([str(work / "venv" / "bin" / "python"), "-m", "pip", "--version"], work)
    return None if pip.returncode == 0 else f"the venv has no pip:\n{pip.stderr.strip()}"


def _libpython_check(python: str) -> Callable[[Path], str | None]:
    # The Python backend's stub links libpythonX.Y.so.1.0 of the Python that runs the models (the venv's base
    # Python for `make serve`, the distribution's python3 in the rehearsal), found in that Python's LIBDIR.
    def check(work: Path) -> str | None:
        loaded = _run([python, "-c", "import ctypes, os, sysconfig; name = sysconfig.get_config_var('INSTSONAME'); "
                       "libdir = sysconfig.get_config_var('LIBDIR'); path = os.path.join(libdir, name); "
                       "ctypes.CDLL(path if os.path.exists(path) else name)"], work)
        return None if loaded.returncode == 0 else f"{python}'s libpython does not load:\n{loaded.stderr.strip()}"

    return check


def _ip_check(work: Path) -> str | None:
    if shutil.which("ip") is None:
        return "ip: not found"
    shown = _run(["ip", "link", "show", "lo"], work)
    return None if shown.returncode == 0 else f"ip link show lo failed: {shown.stderr.strip()}"


def serving_capabilities() -> list[Capability]:
    """What `make serve` needs beyond the prerequisites: the Python backend's stub loads this Python's libpython."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return [Capability(f"libpython{version} of {sys.executable} loads (the Python backend stub links it)",
                       (f"libpython{version}",), _libpython_check(sys.executable))]


def capabilities() -> list[Capability]:
    """What `make test` needs beyond the prerequisites (serving's included)."""
    version = _distribution_python_version() or f"{sys.version_info.major}.{sys.version_info.minor}"
    return [
        *serving_capabilities(),
        Capability("g++ builds the relay and its frame test with ASan/UBSan", ("g++",), _compiler_check("g++")),
        Capability("clang++ builds the relay and its frame test with ASan/UBSan (the rehearsal; the 26.07 image's "
                   "compiler)", ("clang", "libclang-rt-dev"), _compiler_check("clang++")),
        Capability("promtool runs the alert and recording rules' unit tests", ("prometheus",), _promtool_check),
        Capability(f"{DISTRIBUTION_PYTHON} makes the rehearsal's image venv", ("python3", "python3-venv"),
                   _venv_check),
        Capability(f"libpython{version} of {DISTRIBUTION_PYTHON} loads (the rehearsal's Python backend stub links "
                   "it)", (f"libpython{version}",), _libpython_check(DISTRIBUTION_PYTHON)),
        Capability("ip brings up the rehearsal's loopback", ("iproute2",), _ip_check),
    ]


def failing(checks: list[Capability]) -> list[tuple[Capability, str]]:
    failures = []
    for capability in checks:
        with tempfile.TemporaryDirectory(prefix="system-packages-") as work:
            problem = capability.check(Path(work))
        if problem is not None:
            failures.append((capability, problem))
    return failures


def apt_install(packages: list[str]) -> bool:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if subprocess.run(command, env=env, stdout=subprocess.DEVNULL).returncode == 0:
        return True
    subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
    return subprocess.run(command, env=env, stdout=subprocess.DEVNULL).returncode == 0


def main(argv: list[str]) -> int:
    checks = serving_capabilities() if argv == ["--serving"] else capabilities()
    failures = failing(checks)
    if not failures:
        print(f"system packages: every capability works ({len(checks)} checked)")
        return 0
    packages = list(dict.fromkeys(p for capability, _ in failures for p in capability.packages))
    for capability, problem in failures:
        print(f"system packages: NOT WORKING: {capability.what}\n  {problem.replace(chr(10), chr(10) + '  ')}")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print("system packages: the tests need: apt-get install --no-install-recommends", *packages, "(as root)")
        return 1
    print(f"system packages: installing Debian's {' '.join(packages)}")
    if not apt_install(packages):
        print(f"system packages: apt-get install {' '.join(packages)} failed")
        return 1
    still = failing([capability for capability, _ in failures])
    for capability, problem in still:
        print(f"system packages: STILL NOT WORKING after installing: {capability.what}\n  {problem}")
    return 1 if still else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
