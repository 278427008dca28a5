"""bls.server_watch without Triton: a process started the way Triton starts a stub (a child of the "server") leaves
within a second of its parent's SIGKILL, while the parent is still an unreaped zombie, without running Python's
exit handlers, and although a non-daemon thread of its own is still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bls.server_watch import POLL_S

ROOT = Path(__file__).resolve().parents[2]

# The "stub": starts the watch, registers an exit handler that must not run, and keeps a non-daemon thread busy (as
# the BLS's workers and the engine's scheduler are), which a normal interpreter exit would wait for.
STUB = """
import atexit, sys, threading, time
from bls.server_watch import exit_with_server
exit_with_server("model_x")
atexit.register(lambda: open(sys.argv[1], "w").write("finalized"))
threading.Thread(target=lambda: time.sleep(3600)).start()
print("watching", flush=True)
time.sleep(3600)
"""
# The "server": starts the stub, says its pid, and waits to be killed.
SERVER = """
import subprocess, sys, time
stub = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
assert stub.stdout.readline() == "watching\\n"
print(stub.pid, flush=True)
time.sleep(3600)
"""


def test_the_stub_exits_when_its_server_is_killed(tmp_path):
    marker = tmp_path / "finalized"
    server = subprocess.Popen([sys.executable, "-c", SERVER, STUB, str(marker)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        stub = psutil.Process(int(server.stdout.readline()))
        time.sleep(3 * POLL_S)
        assert stub.is_running() and stub.status() != psutil.STATUS_ZOMBIE  # the watch leaves a live server alone
        os.kill(server.pid, signal.SIGKILL)  # not reaped until the end: the server stays a zombie meanwhile
        deadline = time.monotonic() + 4 * POLL_S + 1
        while _alive(stub):
            assert time.monotonic() < deadline, "the stub outlived its server"
            time.sleep(0.05)
        assert psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
        assert not marker.exists()  # os._exit: no Python exit handler, no finalizer ran
        # The stub shares the server's stderr (Triton's log): it says why it left.
        assert f"model_x: tritonserver (pid {server.pid}) is gone" in server.stderr.read()
    finally:
        server.kill()
        server.wait()



def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
