"""A repository built as `make repo STREAM_INTERVAL=4` builds it: tensorrt_llm_bls streams the first token at
once, then responses of at least 4 new tokens, and the streamed text is still exactly the non-streamed text.

Starts its own server on the real tiny target (not possible with --server-url).
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from testkit.grpc import grpc_stream
from testkit.http import generate, generate_stream
from tests.integration.conftest import built_repository_server
from tests.integration.test_bls import BLS, PROMPTS, streamed_text
from tests.integration.test_text import strings

INTERVAL = 4


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    with built_repository_server(request, tmp_path_factory, "interval", stream_interval=INTERVAL) as server:
        yield server


@pytest.mark.parametrize("prompt", PROMPTS[:4])
def test_responses_carry_the_interval_and_add_up_to_the_text(server, prompt):
    body = {"text_input": prompt, "max_tokens": 30, "end_id": -1}
    full = generate(server.http_url, BLS, body)
    events = generate_stream(server.http_url, BLS, {**body, "stream": True, "return_num_output_tokens": True})
    assert streamed_text(events) == full["text_output"]
    counts = [event["num_output_tokens"] for event in events[:-1]]
    steps = [later - earlier for earlier, later in pairwise(counts)]
    # The first token alone; then 4 at a time; the rest before the final response. A response still waiting to
    # be sent absorbs the next one (bls.response_loop), so on a loaded machine one may carry more.
    assert (counts[0] == 1 or counts[0] > INTERVAL) and counts[-1] == 30, counts
    assert all(step >= INTERVAL for step in steps[:-1]) and 0 < steps[-1], counts
    assert len(events) <= 2 + (30 - 1 + INTERVAL - 1) // INTERVAL
    assert events[-1]["num_output_tokens"] == 30 and events[-1]["finish_reason"] == "length"


def test_grpc_streams_follow_the_interval_too(server):
    body = {"text_input": "Once upon a time", "max_tokens": 21, "end_id": -1}
    full = generate(server.http_url, BLS, body)["text_output"]
    inputs = {"text_input": strings(body["text_input"]), "max_tokens": np.array([[21]], dtype=np.int32),
              "end_id": np.array([[-1]], dtype=np.int32), "stream": np.array([[True]])}
    result = grpc_stream(server.grpc_url, BLS, inputs, ["text_output"])
    assert result.error is None and result.completed
    assert "".join(r["text_output"].reshape(-1)[0].decode() for r in result.responses) == full
    assert len(result.responses) <= 2 + (21 - 1 + INTERVAL - 1) // INTERVAL
