"""The handoff's merge of a stream's waiting engine responses (relay/merge.h), through its C++ test binary
(relay/tests/merge_test.cc: merged responses byte for byte what the C++ backend sends for one step that produced
the same tokens, the exact-text ids, every response the rules keep apart refused), compiled here with
AddressSanitizer and UBSan. tests/integration/test_handoff_merge.py sees the merge happen in a server."""

import subprocess

import pytest

from engine_build.repository import RELAY_DIR, RELAY_WARNINGS, _compiler, can_compile_relay, relay_include_dir


def test_the_handoffs_merge_passes_its_test_binary(tmp_path):
    if not can_compile_relay():
        pytest.skip("no C++ compiler (g++ or CXX): the relay is not built here either")
    binary = tmp_path / "merge_test"
    compiled = subprocess.run(
        [_compiler(), "-std=c++17", "-O1", "-g", *RELAY_WARNINGS, "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", f"-I{relay_include_dir()}", "-o", str(binary),
         str(RELAY_DIR / "tests" / "merge_test.cc"), str(RELAY_DIR / "merge.cc")],
        capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
