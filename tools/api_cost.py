"""The OpenAI API's own CPU per streamed response, in-process (issue 49): its ASGI app as `python -m openai_api`
serves it (prometheus_client's multiprocess mode, uvloop), driven without a socket, from a stand-in BLS without
gRPC that yields one text response per token and lets the loop run between them (as a worker that keeps up sees).

    python -m tools.api_cost [--streams 64] [--tokens 256] [--rounds 5]

What it leaves out is what `make bench --only openai` adds: the gRPC read of each response (grpc.aio and its
poller thread) and the HTTP write (a socket write each). Its figure is the API's Python layers (routing, our
stream code, the metrics, the SSE framing, Starlette's response and uvicorn's ASGI interface above the transport),
steady against the host's noise, for comparing two versions of that code: run each tree's, alternated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

import uvloop

MODEL = "bench"


class StandInBls:
    """tensorrt_llm_bls's streamed responses for one request of `tokens` tokens, one a response, no server."""

    tokens = 256

    def __init__(self, url: str):
        pass

    async def close(self) -> None:
        pass

    async def generate(self, inputs):
        from openai_api.triton import BlsResponse

        for _ in range(self.tokens - 1):
            await asyncio.sleep(0)
            yield BlsResponse(" word")
        await asyncio.sleep(0)
        yield BlsResponse(" end", finish_reason="length", num_input_tokens=12, num_output_tokens=self.tokens)


async def _stream(app, body: bytes) -> int:
    """One streamed chat request through the ASGI app: the body writes it made."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "state": {}}
    read, done, writes = False, asyncio.Event(), 0

    async def receive():
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()  # the client stays until the response ends
        return {"type": "http.disconnect"}

    async def send(message):
        nonlocal writes
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"the API answered {message['status']}")
        if message["type"] == "http.response.body":
            writes += 1
            if not message.get("more_body"):
                done.set()

    await app(scope, receive, send)
    return writes


async def _measure(streams: int, tokens: int, rounds: int) -> list[float]:
    import openai_api.app

    StandInBls.tokens = tokens
    openai_api.app.TritonBls = StandInBls
    app = openai_api.app.create_app(openai_api.app.Settings(triton_grpc="stand-in:0", model_name=MODEL))
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
                       "max_tokens": tokens, "stream": True, "temperature": 0, "seed": 7,
                       "stream_options": {"include_usage": True}}).encode()
    lifespan_in, lifespan_out = asyncio.Queue(), asyncio.Queue()
    lifespan = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                       lifespan_in.get, lifespan_out.put))
    await lifespan_in.put({"type": "lifespan.startup"})
    await lifespan_out.get()
    await _stream(app, body)  # warm-up
    figures = []
    for _ in range(rounds):
        began = time.process_time()
        await asyncio.gather(*(_stream(app, body) for _ in range(streams)))
        figures.append((time.process_time() - began) / (streams * tokens) * 1e6)
    await lifespan_in.put({"type": "lifespan.shutdown"})
    await lifespan
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.api_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256, help="tokens (responses) a stream")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from openai_api.__main__ import METRICS_DIR_ENV

    with tempfile.TemporaryDirectory(prefix="api-cost-metrics-") as metrics_dir:
        os.environ[METRICS_DIR_ENV] = metrics_dir  # before prometheus_client is imported, as the API sets it
        figures = uvloop.run(_measure(args.streams, args.tokens, args.rounds))
    print(f"{args.streams} streams of {args.tokens} tokens, µs of CPU a streamed response, each round: "
          + " ".join(f"{figure:.2f}" for figure in figures))


if __name__ == "__main__":
    main()
