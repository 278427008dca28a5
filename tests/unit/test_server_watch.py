"""bls.server_watch without Triton: a process started the way Triton starts a stub (a child of the "server") is ended
within a second of its parent's SIGKILL, while the parent is still an unreaped zombie and although the stub holds the
GIL (as a stub waiting for a dead server does), without running any of its exit handlers; a stub that ends by itself
takes its watcher with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

# The "stub": starts the watch, registers an exit handler that must not run, and blocks in a C call that keeps the GIL
# (ctypes.PyDLL does not release it), as pb_stub.cc's SendIPCMessage does once its server is gone.
STUB = """
import atexit, ctypes, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as Triton's stub: a server's SIGTERM to its group does not end it
from bls.server_watch import exit_with_server
exit_with_server("model_x", poll_s=0.1)
atexit.register(lambda: open(sys.argv[1], "w").write("finalized"))
print("watching", flush=True)
ctypes.PyDLL(None).sleep(3600)
"""
# The "server": starts the stub, says its pid, and waits to be killed (in a session of its own: its process group is
# the server, the stub and the watcher, as serving.tritonserver starts tritonserver).
SERVER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as tritonserver, which then waits for its requests
stub = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
assert stub.stdout.readline() == "watching\\n"
print(stub.pid, flush=True)
time.sleep(3600)
"""


def test_the_stub_exits_when_its_server_is_killed(tmp_path):
    marker = tmp_path / "finalized"
    server = subprocess.Popen([sys.executable, "-c", SERVER, STUB, str(marker)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              start_new_session=True)
    try:
        stub = psutil.Process(int(server.stdout.readline()))
        watcher = stub.children()[0]
        time.sleep(0.3)  # the watcher has started
        os.killpg(server.pid, signal.SIGTERM)  # as serving.tritonserver stops a server: the stub and watcher stay
        time.sleep(0.5)
        assert _alive(stub) and _alive(watcher)
        os.kill(server.pid, signal.SIGKILL)  # not reaped until the end: the server stays a zombie meanwhile
        deadline = time.monotonic() + 1.5
        while _alive(stub):
            assert time.monotonic() < deadline, "the stub outlived its server"
            time.sleep(0.05)
        assert psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
        assert not marker.exists()  # SIGKILL: no Python exit handler, no finalizer ran
        # The stub shares the server's stderr (Triton's log): it says why it left.
        assert (f"model_x: tritonserver (pid {server.pid}) is gone; its stub process (pid {stub.pid}) is killed"
                in server.stderr.read())
    finally:
        server.kill()
        server.wait()



def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_watcher_leaves_with_its_stub():
    """A stub that ends by itself (an unload) leaves no watcher behind."""
    stub = subprocess.Popen([sys.executable, "-c", "from bls.server_watch import exit_with_server; "
                             "print(exit_with_server('m', poll_s=0.1).pid)"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    watcher = psutil.Process(int(stub.stdout.readline()))
    stub.wait()
    deadline = time.monotonic() + 1.5
    while _alive(watcher):
        assert time.monotonic() < deadline, "the watcher outlived its stub"
        time.sleep(0.05)
