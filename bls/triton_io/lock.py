"""PB_LOCK: the lock every pb_utils call of a process takes."""

from __future__ import annotations

import threading

# Every pb_utils call of the BLS (taking a sender, reading inputs, building and sending responses, child
# requests, metrics) goes through this one lock: the Triton 2.51 stub is not safe against such calls from
# several threads at once (a BLS serving many streams on threads died with "double free or corruption"; with
# a lock per stream instead, so that sends of different streams overlapped, the BLS stub died within 90 s of
# the 256-client soak). Every wait on another model (exec) stays outside it: one stream waiting for its
# engine must not stop the others. The embedded engine's metrics have their own lock (Metrics).
PB_LOCK = threading.RLock()
