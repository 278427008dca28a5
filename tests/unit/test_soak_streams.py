"""What the soak makes of an HTTP stream's events (tools/soak.py http_stream), against a small server that answers
as Triton's generate_stream does."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.soak import Target, http_stream


def serve(events_for):
    """A generate_stream endpoint whose events are events_for(request_id)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            payload = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events_for(body["id"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


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
    server = serve(events)
    try:
        target = Target(f"127.0.0.1:{server.server_port}", "unused", "unused", 0)
        result = http_stream("bls_stream_http", {"text_input": "hi"})(target, 5.0)
    finally:
        server.shutdown()
        server.server_close()
    assert (result.outcome, result.error) == (outcome, error)
