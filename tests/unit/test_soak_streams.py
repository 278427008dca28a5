"""What the soak makes of Triton's answers (tools/soak.py): an HTTP stream's events, and the engines' gauges
after quiesce, against a small server that answers as Triton's generate_stream and metrics endpoints do."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.soak import Target, http_stream, wait_engines_idle

# The embedded engine's gauges as Triton exposes them behind the bench's engine relay: the Python models are
# tensorrt_llm_python and tensorrt_llm_draft_python, not the names clients call.
RELAYED_ENGINE_METRICS = """\
# HELP embedded_engine_active_sequences Sequences being generated
# TYPE embedded_engine_active_sequences gauge
embedded_engine_active_sequences{model="tensorrt_llm_python"} 3
embedded_engine_active_sequences{model="tensorrt_llm_draft_python"} 0
# HELP embedded_engine_queued_sequences Sequences waiting for a slot
# TYPE embedded_engine_queued_sequences gauge
embedded_engine_queued_sequences{model="tensorrt_llm_python"} 2
embedded_engine_queued_sequences{model="tensorrt_llm_draft_python"} 0
# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="tensorrt_llm_bls",version="1"} 7
"""


def serve(answer):
    """A local HTTP server answering every GET and POST with answer(request body) -> (content type, payload)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))

        def do_GET(self):
            self._answer(b"")

        def _answer(self, body: bytes):
            content_type, payload = answer(body)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def generate_stream(events_for):
    """A generate_stream answer whose events are events_for(request_id)."""
    def answer(body: bytes):
        events = events_for(json.loads(body)["id"])
        return "text/event-stream", b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)
    return answer


@pytest.mark.parametrize("events, outcome, error", [
    (lambda rid: [{"id": rid, "text_output": "a"}, {"id": rid, "text_output": "", "finish_reason": "length"}],
     "ok", None),
    # Triton's error events carry no id: the stream's own error, not another request's event
    (lambda rid: [{"id": rid, "text_output": "a"}, {"error": "tensorrt_llm: no event for 60 s"}],
     "unexpected_error", "tensorrt_llm: no event for 60 s"),
    (lambda rid: [{"id": "someone-else", "text_output": "a"}],
     "unexpected_error", "cross-talk: an event of request 'someone-else' on the connection of another request"),
])
def test_a_streams_events_are_judged_by_their_id_and_errors_by_their_message(events, outcome, error):
    server = serve(generate_stream(events))
    try:
        target = Target(f"127.0.0.1:{server.server_port}", "unused", "unused", 0)
        result = http_stream("bls_stream_http", {"text_input": "hi"})(target, 5.0)
    finally:
        server.shutdown()
        server.server_close()
    assert (result.outcome, result.error) == (outcome, error)


def test_sequences_left_in_engines_behind_their_relays_are_reported():
    server = serve(lambda _body: ("text/plain; version=0.0.4", RELAYED_ENGINE_METRICS.encode()))
    try:
        left = wait_engines_idle(f"http://127.0.0.1:{server.server_port}/metrics", timeout_s=0)
    finally:
        server.shutdown()
        server.server_close()
    assert left == {"tensorrt_llm_python": 5, "tensorrt_llm_draft_python": 0}
