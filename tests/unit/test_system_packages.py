"""tools/system_packages.py proves each capability by doing it: a compiler found on PATH but unable to link or run a
sanitized program is reported as not working (a fresh Debian 12 had clang without its sanitizer runtime and failed
`make test` in the rehearsal), and so is one whose sanitizer does not catch a heap overflow."""

import os
import shutil
from pathlib import Path

import pytest

from tools import system_packages


def _wrapper(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.fixture
def real_gpp() -> str:
    found = shutil.which("g++")
    if found is None:
        pytest.skip("no g++ (a README prerequisite) to build the wrappers on")
    return found


def test_a_compiler_that_cannot_link_sanitizers_is_not_working(tmp_path, monkeypatch, real_gpp):
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir(), work.mkdir()
    # clang without libclang-rt-dev: compiles, but the link of -fsanitize fails as ld reported it on Debian 12.
    _wrapper(bin_dir, "clang++", f"""case "$*" in *-fsanitize*)
  echo "/usr/bin/ld: cannot find libclang_rt.asan_static-x86_64.a" >&2; exit 1;; esac
exec {real_gpp} "$@"
""")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    problem = system_packages._compiler_check("clang++")(work)
    assert problem is not None and "cannot link a program with -fsanitize=address,undefined" in problem
    assert "libclang_rt.asan_static" in problem


def test_a_sanitizer_that_catches_nothing_is_not_working(tmp_path, monkeypatch, real_gpp):
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir(), work.mkdir()
    # Links and runs, but with the sanitizer flags dropped: the heap overflow goes unreported.
    _wrapper(bin_dir, "clang++", f"""args=""
for a in "$@"; do case "$a" in -fsanitize*|-fno-sanitize*) ;; *) args="$args $a";; esac; done
exec {real_gpp} $args
""")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    problem = system_packages._compiler_check("clang++")(work)
    assert problem == "clang++'s AddressSanitizer did not report a heap overflow"


def test_a_missing_compiler_names_itself(tmp_path):
    assert system_packages._compiler_check("no-such-compiler++")(tmp_path) == "no-such-compiler++: not found"


def test_g_plus_plus_links_and_runs_a_sanitized_program_here(tmp_path, real_gpp):
    # The README's prerequisite itself, on this machine: the real check passes (libasan comes with g++).
    assert system_packages._compiler_check("g++")(tmp_path) is None


def test_each_capability_names_debian_packages_of_both_releases():
    names = {p for capability in system_packages.capabilities() for p in capability.packages}
    # Unversioned names that exist on Debian 12 and 13 alike (libpythonX.Y follows the distribution's python3).
    assert {"g++", "clang", "libclang-rt-dev", "prometheus", "python3-venv", "iproute2"} <= names
    assert any(name.startswith("libpython3.") for name in names)
