"""The relay's C++ test binaries (relay/tests/), each compiled here with AddressSanitizer and UBSan so that `make test`
(and CI) builds and runs them:
- frames_test.cc: the frame code against the golden frames (every kind read, the relay's own kinds written byte for
  byte, the stream token, hostile bytes refused); bls/relay/frames.py is held to the same frames by
  test_relay_frames.py.
- merge_test.cc: the handoff's merge of a stream's waiting engine responses (relay/merge.h): merged responses byte for
  byte what the C++ backend sends for one step that produced the same tokens, the exact-text ids, every response the
  rules keep apart refused; tests/integration/test_handoff_merge.py sees the merge happen in a server."""

import subprocess

import pytest

from engine_build.repository import RELAY_DIR, RELAY_WARNINGS, _compiler, can_compile_relay, relay_include_dir
from tests.unit.test_relay_frames import FIXTURES

# binary -> (its sources besides relay/tests/<binary>.cc, its arguments)
BINARIES = {
    "frames_test": (("frames.cc", "token.cc"), (str(FIXTURES),)),
    "merge_test": (("merge.cc",), ()),
}


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_the_relays_test_binary_passes(tmp_path, name):
    if not can_compile_relay():
        pytest.skip("no C++ compiler (g++ or CXX): the relay is not built here either")
    sources, arguments = BINARIES[name]
    binary = tmp_path / name
    compiled = subprocess.run(
        [_compiler(), "-std=c++17", "-O1", "-g", *RELAY_WARNINGS, "-fsanitize=address,undefined",
         "-fno-sanitize-recover=all", f"-I{relay_include_dir()}", "-o", str(binary),
         str(RELAY_DIR / "tests" / f"{name}.cc"), *(str(RELAY_DIR / source) for source in sources)],
        capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    result = subprocess.run([str(binary), *arguments], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
