"""`make lint` can fail: ruff with this project's rules refuses an unused import, and each C++ compiler here, with the
relay's flags, refuses an unused variable (tools/lint_cpp.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tools.lint_cpp import check, compilers

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_refuses_an_unused_import():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--stdin-filename", "tools/example.py", "-"],
                            input='"""An example."""\n\nimport os\n', capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1 and "F401" in result.stdout, result.stdout + result.stderr


def test_every_compiler_refuses_a_warning(tmp_path):
    if not compilers():
        pytest.skip("no C++ compiler (g++ or clang++): `make lint` says what to install")
    warned, clean = tmp_path / "warned.cc", tmp_path / "clean.cc"
    warned.write_text("int answer() {\n  int unused = 0;\n  return 42;\n}\n")
    clean.write_text("int answer() {\n  return 42;\n}\n")
    for compiler in compilers():
        assert "unused" in (check(compiler, warned) or ""), compiler
        assert check(compiler, clean) is None, compiler
