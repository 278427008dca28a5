"""The handoff merges a stream's engine responses that wait together for its sender (relay/merge.h), against a
server of its own: the C++ bench engine (tools/bench_engine, one response per token per stream from one thread, as
TensorRT-LLM's backend sends) stepping as fast as it goes, and one sender thread, so that many streams outrun the
sender and their responses queue. Clients must get exactly the unstreamed text, split characters included (the
stream state rides on merged responses), and the request metrics the same tokens and finish reasons, in fewer
responses than tokens: merging must have happened, or the test proves nothing. relay/tests/merge_test.cc holds
each output's rule."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tokenizers import Tokenizer

from engine_build.repository import can_compile_relay
from serving.tritonserver import TritonServer
from testkit.grpc import grpc_stream
from testkit.http import generate
from tests.integration.conftest import ASSETS, Endpoint, assembled_repository
from tests.integration.test_metrics import delta, scrape, scrape_until
from tools import bench_engine

ENSEMBLE = "ensemble"
STREAMS = 48
MAX_TOKENS = 60
# English, then characters byte-level BPE splits into several tokens: a stream's responses go out without the
# stream state until its first piece of a character, with it from then on; merged responses of both kinds.
CYCLE_TEXT = " The quick brown fox 🇫🇷 jumps over 龘 the 𝄞 dog."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("no C++ compiler here: the handoff is part of the relay (relay/), the bench engine is C++")
    repo = assembled_repository(tmp_path_factory, "handoff-merge", synthetic=True, handoff_sender_threads=1,
                                max_active_requests=STREAMS, max_queued_requests=STREAMS)
    cycle = Tokenizer.from_file(str(ASSETS / "tokenizer" / "tokenizer.json")).encode(
        CYCLE_TEXT, add_special_tokens=False).ids
    bench_engine.install(repo, step_ms=0.0, max_active_requests=STREAMS, max_queued_requests=STREAMS,
                         text_cycle=cycle)
    with TritonServer(repo, log_path=tmp_path_factory.mktemp("log") / "tritonserver.log") as server:
        yield server


def _inputs(prompt: str, index: int) -> dict:
    # Half the streams say the prompt may be repeated: a stream never repeats it (the engine streams only new
    # tokens), so the metrics must count their tokens all the same.
    return {"text_input": np.array([[prompt.encode()]], dtype=object),
            "max_tokens": np.array([[MAX_TOKENS]], np.int32), "end_id": np.array([[-1]], np.int32),
            "stream": np.array([[True]]), "exclude_input_in_output": np.array([[index % 2 == 0]])}


def test_streams_that_outrun_the_sender_get_the_unstreamed_text_and_counts_in_merged_responses(server):
    endpoint = Endpoint(server.http_url, server.grpc_url, server.metrics_url)
    # Prompts of different lengths start the cycle at different places (the bench engine's token p is cycle[p]).
    prompts = [f"Stream {'number ' * (i % 7)}{i}" for i in range(STREAMS)]
    expected = {prompt: generate(server.http_url, ENSEMBLE, {"text_input": prompt, "max_tokens": MAX_TOKENS,
                                                             "end_id": -1})["text_output"] for prompt in set(prompts)}
    assert any("\ufffd" not in text and any(len(c.encode()) == 4 for c in text) for text in expected.values())
    before = scrape(endpoint)
    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(lambda index: grpc_stream(server.grpc_url, ENSEMBLE, _inputs(prompts[index], index),
                                                          ["text_output"], timeout=300), range(STREAMS)))
    responses = 0
    for prompt, result in zip(prompts, results, strict=True):
        assert result.error is None and result.completed, result.error
        assert "".join(b"".join(r["text_output"].reshape(-1)).decode() for r in result.responses) == expected[prompt]
        responses += len(result.responses)
    # The engine sends a response per token: fewer reached the clients only if the handoff merged them.
    assert responses < STREAMS * MAX_TOKENS, responses
    print(f"{responses} responses for {STREAMS * MAX_TOKENS} tokens")
    # The request metrics count every token and finish each stream as unmerged (length: max_tokens reached).
    after = scrape_until(endpoint, lambda s: delta(before, s, "llm_requests_total", model=ENSEMBLE,
                                                   finish_reason="length") >= STREAMS)
    assert delta(before, after, "llm_requests_total", model=ENSEMBLE, finish_reason="length") == STREAMS
    assert delta(before, after, "llm_requests_total", model=ENSEMBLE, finish_reason="stop") == 0
    assert delta(before, after, "llm_generation_tokens_total", model=ENSEMBLE) == STREAMS * MAX_TOKENS
