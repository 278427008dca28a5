"""Every Python model's stub ends when its tritonserver does, however the server ended (SIGTERM past
--exit-timeout-secs, SIGKILL, a crash).

Triton launches each model's stub as its own child (the relay's Python processes are those stubs too), and nothing
ends a stub when tritonserver dies without unloading its model. The stub's own check (python_backend's pb_stub.cc,
every 300 ms: kill(parent_pid, 0)) takes a dead parent that its own parent has not reaped yet (a zombie) for alive;
when it does see the parent gone it destroys the model under a dead server (Python destructors that write to the
server's shared memory: MetricFamily's crashes, bls.triton_io.metrics.Metrics.close). And a thread of the stub cannot do
better: a stub whose server died while it answered a request waits for the server forever holding the GIL
(pb_stub.cc ProcessRequests -> SendIPCMessage retries its push to the parent's queue without end), so no Python
thread of it runs again.

So the watch is a process of its own: a small Python (stdlib only, no site) started by the stub, polling the stub's
parent in /proc every POLL_S. A process whose parent dies is re-parented at once (to init or the nearest subreaper),
zombie parent or not; when the stub's parent is no longer the server, the watcher says so in the server's log (the
stderr both share) and SIGKILLs the stub: nothing of it runs any more, no finalizer, no destructor. The watcher
leaves when the stub is gone (a normal unload included). It holds no descriptor of the stub's but the standard ones.
"""

from __future__ import annotations

import os
import subprocess
import sys

POLL_S = 0.5

# The watcher: argv stub_pid server_pid model_name poll_s. A stub is known by its pid and start time (field 22 of
# /proc/pid/stat), so a pid reused after the stub ended is never taken for it. It is in the server's process group,
# whose SIGINT (Ctrl-C of make serve), SIGTERM (serving.tritonserver's stop) and SIGHUP it ignores: the server may
# outlive them by --exit-timeout-secs and then exit without unloading, and the watcher must still be there.
_WATCHER = r"""
import os, signal, sys, time
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, signal.SIG_IGN)
stub, server, name, poll_s = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
def parent_and_start(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None, None
    return int(fields[1]), fields[19]
parent, started = parent_and_start(stub)
while parent == server:
    time.sleep(poll_s)
    parent, start = parent_and_start(stub)
    if start != started:
        sys.exit(0)
if parent is not None:
    os.write(2, f"{name}: tritonserver (pid {server}) is gone; its stub process (pid {stub}) is killed\n".encode())
    os.kill(stub, signal.SIGKILL)
"""


def exit_with_server(model_name: str, poll_s: float = POLL_S) -> subprocess.Popen:
    """From the model's initialize(): start the watcher of this process (the stub) and its parent, tritonserver."""
    # sys.executable: in a stub, the first python3 on PATH (the stub takes its prefix from it: serving.tritonserver).
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), str(os.getppid()), model_name, str(poll_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
