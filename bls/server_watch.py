"""Every Python model's stub ends when its tritonserver does, however the server ended (SIGTERM past
--exit-timeout-secs, SIGKILL, a crash).

Triton launches each model's stub as its own child (the relay's Python processes are those stubs too); nothing
ends a stub when tritonserver dies without unloading the model. The stub's own check (python_backend's
pb_stub.cc: kill(parent_pid, 0) every 300 ms) does not see a parent that is dead but not yet reaped by its own
parent (a zombie still has its pid), and when it does see one it finalizes Python, which waits for every
non-daemon thread (the BLS's workers, the engine's scheduler) and runs destructors that write to the shared memory
of a server that is gone: the stub then hangs, or crashes (the known one: MetricFamily's destructor when finalize
did not run, bls.triton_io.Metrics.close). A stub that outlives its server also keeps its model's memory and
its threads' CPU.

The watch: a daemon thread that asks the kernel for the stub's parent every POLL_S. A process whose parent dies is
re-parented at once (to init, or the nearest subreaper), zombie or not, so the parent pid changes; the stub then
leaves with os._exit: no Python finalization, no destructor touching the dead server's shared memory, no thread
waited for.
"""

from __future__ import annotations

import os
import threading
import time

POLL_S = 0.5
# The exit status of a stub that left because its server was gone (os._exit: nothing else runs).
EXIT_STATUS = 3

_started = False
_lock = threading.Lock()


def exit_with_server(model_name: str) -> None:
    """From the model's initialize(): start the watch over this process's parent, tritonserver (once per process)."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    server_pid = os.getppid()
    threading.Thread(target=_watch, args=(server_pid, model_name), name="server-watch", daemon=True).start()


def _watch(server_pid: int, model_name: str, poll_s: float = POLL_S) -> None:
    while os.getppid() == server_pid:
        time.sleep(poll_s)
    try:  # the log is the server's stdout/stderr, which this process shares and may outlive
        os.write(2, f"{model_name}: tritonserver (pid {server_pid}) is gone; this model's stub process "
                    f"(pid {os.getpid()}) exits\n".encode())
    except OSError:
        pass
    os._exit(EXIT_STATUS)
