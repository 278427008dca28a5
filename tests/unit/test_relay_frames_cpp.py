"""The relay's C++ frame code against the golden frames (relay/tests/frames_test.cc: every kind read, the relay's
own kinds written byte for byte, the stream token, hostile bytes refused), compiled here with AddressSanitizer and
UBSan so that `make test` (and CI) builds and runs it. bls/relay/frames.py is held to the same frames by
test_relay_frames.py."""

import subprocess

import pytest

from engine_build.repository import RELAY_DIR, RELAY_WARNINGS, _compiler, can_compile_relay, relay_include_dir
from tests.unit.test_relay_frames import FIXTURES


def test_the_relays_frame_code_passes_its_test_binary(tmp_path):
    if not can_compile_relay():
        pytest.skip("no C++ compiler (g++ or CXX): the relay is not built here either")
    binary = tmp_path / "frames_test"
    compiled = subprocess.run(
        [_compiler(), "-std=c++17", "-O1", "-g", *RELAY_WARNINGS, "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", f"-I{relay_include_dir()}", "-o", str(binary),
         str(RELAY_DIR / "tests" / "frames_test.cc"), str(RELAY_DIR / "frames.cc"), str(RELAY_DIR / "token.cc")],
        capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    result = subprocess.run([str(binary), str(FIXTURES)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
