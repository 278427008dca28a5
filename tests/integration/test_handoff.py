"""The ensemble through the handoff (relay/handoff.h), against a server of its own: a repository built with two
sender threads (the session server's has one on CI's 2 cores). Clients must see exactly what the engine sends, in
order: text, generation details, batches, errors; postprocessing must get the stream's state exactly where a
response's text needs it.
"""

from __future__ import annotations

import json
import math
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from engine_build.repository import HANDOFF_MODEL, can_compile_relay
from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream, streamed_texts
from tests.integration.conftest import built_repository_server

ENSEMBLE = "ensemble"
BLS = "tensorrt_llm_bls"
SENDERS = 2
# The engine fails at its third token (tests/integration/test_faults.py says how, with no test hook).
ENGINE_FAILS_AT_THIRD_TOKEN = {"frequency_penalty": -3e38, "top_k": 50, "end_id": -1}
PROMPTS = ("Tell me a story about a brave little toaster.", "Der Käse ist 100 % naturbelassen — 日本語も")
# Characters that byte-level BPE splits into several tokens (emoji, CJK, Greek): a bias this strong on their tokens
# makes the tiny model's greedy choice one of those pieces at every step, so characters are split across responses,
# some byte runs never complete (U+FFFD) and max_tokens may cut one.
SPLIT_CHARACTERS = {"embedding_bias_words": ["😀🇫🇷東京ώρα"], "embedding_bias_weights": [60.0]}


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    if not can_compile_relay():
        pytest.skip("no C++ compiler here: the handoff is part of the relay (relay/)")
    with built_repository_server(request, tmp_path_factory, "handoff",
                                 handoff_sender_threads=SENDERS) as server:
        yield server


def _model_config(server, model: str) -> dict:
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/config", timeout=30) as response:
        return json.loads(response.read())


def _sender_threads(pid: int) -> int:
    return sum(1 for task in Path(f"/proc/{pid}/task").iterdir()
               if (task / "comm").read_text().strip() == "handoff_sender")


def test_the_ensemble_goes_through_the_handoff_and_its_senders(server):
    steps = _model_config(server, ENSEMBLE)["ensemble_scheduling"]["step"]
    assert [step["model_name"] for step in steps] == ["preprocessing", HANDOFF_MODEL, "postprocessing"]
    assert _model_config(server, HANDOFF_MODEL)["parameters"]["handoff_to"]["string_value"] == "tensorrt_llm"
    assert _sender_threads(server.process.pid) == SENDERS


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_text_through_the_handoff_is_the_text_unstreamed_and_the_bls_text(server, prompt):
    body = {"text_input": prompt, "max_tokens": 24, "end_id": -1}
    whole = generate(server.http_url, ENSEMBLE, body)["text_output"]
    events = generate_stream(server.http_url, ENSEMBLE, {**body, "stream": True})
    assert "".join(event["text_output"] for event in events) == whole
    assert generate(server.http_url, BLS, body)["text_output"] == whole
    assert len(events) >= 24  # one response per engine response, in order: nothing merged, nothing lost


@pytest.mark.parametrize("max_tokens", [7, 8, 9, 24])
def test_characters_split_across_responses_stream_exactly(server, max_tokens):
    """Each response from the first split character on is decoded with the ids before it (the handoff's stream
    state): streamed ==
    unstreamed,
    ending mid-character included (then both end in U+FFFD), and an event whose ids only start a character is
    empty instead of NVIDIA's U+FFFD pieces."""
    body = {"text_input": PROMPTS[1], "max_tokens": max_tokens, "end_id": -1, **SPLIT_CHARACTERS}
    whole = generate(server.http_url, ENSEMBLE, body)["text_output"]
    assert any(len(char.encode()) > 1 and char != "\ufffd" for char in whole), whole  # multi-byte text came out
    events = generate_stream(server.http_url, ENSEMBLE, {**body, "stream": True})
    assert "".join(event["text_output"] for event in events) == whole
    assert len(events) == max_tokens  # one response per engine response: held bytes wait, nothing is merged
    assert any(event["text_output"] == "" for event in events)  # a character's first bytes were held
    assert generate(server.http_url, BLS, body)["text_output"] == whole


def _handoff_stream(server, bundle, prompt: str, bias: np.ndarray | None) -> list[dict]:
    """The handoff's responses to an engine request of its own asking for the stream state, as the ensemble does."""
    prompt_ids = bundle.encode_text(prompt, add_special_tokens=True)
    inputs = {"input_ids": np.array([prompt_ids], np.int32), "input_lengths": np.array([[len(prompt_ids)]], np.int32),
              "request_output_len": np.array([[24]], np.int32), "end_id": np.array([[-1]], np.int32),
              "streaming": np.array([[True]]), "exclude_input_in_output": np.array([[True]])}
    if bias is not None:
        inputs["embedding_bias"] = bias.reshape(1, -1)
    result = grpc_stream(server.grpc_url, HANDOFF_MODEL, inputs, ["output_ids", "sequence_length", "preceding_ids"],
                         timeout=60)
    assert result.error is None and result.completed, result.error
    return result.responses


def test_the_stream_state_goes_with_a_streams_responses_from_its_first_split_character_on(server):
    """Every response the handoff sends without preceding_ids decodes alone to exactly its share of the text (judged
    from the tokenizer's bytes here, not from the handoff's table); one with it holds the stream's last ids (-1 after
    them on the final one), and from the first on, every response has it. Text of whole characters carries no state
    at all: the ensemble's cost per token stays NVIDIA's (docs/benchmarks.md)."""
    from bls.text.detokenizer import PRECEDING_TOKENS, continuation_text
    from bls.text.tokenizer import TokenizerBundle
    from engine_build.repository import repository_tokenizer

    bundle = TokenizerBundle.from_dir(repository_tokenizer(server.repo))

    def responses_with_state(responses: list[dict]) -> int:
        earlier: list[int] = []
        with_state = 0
        for index, response in enumerate(responses):
            ids = response["output_ids"][0, 0, : int(response["sequence_length"][0, 0])].tolist()
            final = index == len(responses) - 1
            if "preceding_ids" in response:
                with_state += 1
                assert response["preceding_ids"].tolist() == [[earlier[-PRECEDING_TOKENS:] + [-1] * final]]
            else:
                assert not with_state, index  # from the first response with it on, every one has it
                assert bundle.decode(ids, True) == continuation_text(bundle, earlier[-PRECEDING_TOKENS:], ids, final)
            earlier += ids
        return with_state

    plain = _handoff_stream(server, bundle, PROMPTS[0], None)
    assert len(plain) >= 12 and responses_with_state(plain) == 0
    # A bias too weak to split characters at once: English first, then pieces of characters.
    turning = _handoff_stream(server, bundle, PROMPTS[0], bundle.embedding_bias(["😀🇫🇷東京ώρα"], [6.0]))
    assert 0 < responses_with_state(turning) < len(turning) - 4


def test_guided_json_streams_exactly(server):
    """A guided JSON document whose name must be multi-byte characters (the tiny model spells them in byte pieces)
    streams as the unstreamed document, which follows its schema."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[ώρα東京😀]{4,8}$"}},
              "required": ["name"]}
    body = {"text_input": "Name in Greek as JSON:", "max_tokens": 40, "guided_decoding_guide_type": "json_schema",
            "guided_decoding_guide": json.dumps(schema)}
    whole = generate(server.http_url, ENSEMBLE, body)["text_output"]
    assert re.fullmatch("[ώρα東京😀]{4,8}", json.loads(whole)["name"]), whole
    events = generate_stream(server.http_url, ENSEMBLE, {**body, "stream": True})
    assert "".join(event["text_output"] for event in events) == whole
    assert any(event["text_output"] == "" for event in events[:-1])  # a character's first bytes were held


def test_a_stream_the_end_id_ends_sends_its_empty_final_response(server):
    """The end id is not part of the output: the engine's final response adds no text (no state: nothing pending),
    and the stream still ends with the unstreamed text."""
    from bls.text.tokenizer import TokenizerBundle
    from engine_build.repository import repository_tokenizer

    bundle = TokenizerBundle.from_dir(repository_tokenizer(server.repo))
    body = {"text_input": PROMPTS[0], "max_tokens": 12, "end_id": -1}
    ids = bundle.encode_text(generate(server.http_url, ENSEMBLE, body)["text_output"], add_special_tokens=False)
    end_id = ids[4]  # the model's fifth token ends the sequence now (text re-encoded: ASCII round-trips)
    body["end_id"] = end_id
    whole = generate(server.http_url, ENSEMBLE, body)["text_output"]
    events = generate_stream(server.http_url, ENSEMBLE, {**body, "stream": True})
    assert "".join(event["text_output"] for event in events) == whole == bundle.decode(ids[: ids.index(end_id)], True)
    assert events[-1]["text_output"] == ""


def test_an_end_id_right_after_half_a_character_ends_the_stream_as_unstreamed(server):
    """The engine's final response brings no ids while a character's first bytes are held: the handoff's state on it
    (-1: the text ends) turns them into U+FFFD, as the unstreamed decode ends."""
    from bls.text.detokenizer import pending_bytes
    from bls.text.tokenizer import TokenizerBundle
    from engine_build.repository import repository_tokenizer

    bundle = TokenizerBundle.from_dir(repository_tokenizer(server.repo))
    body = {"text_input": PROMPTS[1], "max_tokens": 24, "end_id": -1, **SPLIT_CHARACTERS}
    ids = [token for response in _handoff_stream(server, bundle, PROMPTS[1],
                                                 bundle.embedding_bias(*SPLIT_CHARACTERS.values()))
           for token in response["output_ids"][0, 0, : int(response["sequence_length"][0, 0])].tolist()]
    assert bundle.decode(ids, True) == generate(server.http_url, ENSEMBLE, body)["text_output"]  # the same ids
    cut = next(k for k in range(2, len(ids)) if pending_bytes(bundle, ids[:k]) and ids[k] not in ids[:k])
    body["end_id"] = ids[cut]
    whole = generate(server.http_url, ENSEMBLE, body)["text_output"]
    assert whole == bundle.decode(ids[:cut], True) and whole.endswith("\ufffd"), whole
    events = generate_stream(server.http_url, ENSEMBLE, {**body, "stream": True})
    assert "".join(event["text_output"] for event in events) == whole
    assert events[-1]["text_output"] == "\ufffd"  # the held bytes, ended by the final response's state


def test_streams_without_exact_text_keep_one_text_per_response(server):
    """A batch of two rows (its rows' ends are not flagged apart) gets no stream state, so it is decoded response by
    response, as NVIDIA's postprocessing does: no response's text is held back (each row's text adds up: the batch
    test below)."""
    inputs = {"text_input": np.array([[PROMPTS[0].encode()], [PROMPTS[1].encode()]], dtype=object),
              "max_tokens": np.array([[5], [5]], np.int32), "end_id": np.array([[-1], [-1]], np.int32),
              "stream": np.array([[True], [True]])}
    result = grpc_stream(server.grpc_url, ENSEMBLE, inputs, ["text_output", "batch_index"], timeout=60)
    assert result.error is None, result.error
    assert all(b"".join(r["text_output"].reshape(-1)) for r in result.responses if "text_output" in r)


def test_concurrent_streams_over_the_senders_each_keep_their_own_text_in_order(server):
    """Streams spread over the senders (one stream on one sender): each stream's events add up to its own text."""
    bodies = [{"text_input": f"{PROMPTS[i % 2]} ({i})", "max_tokens": 10 + i, "end_id": -1} for i in range(12)]
    for body, text in zip(bodies, streamed_texts(server.http_url, ENSEMBLE, bodies), strict=True):
        assert text == generate(server.http_url, ENSEMBLE, body)["text_output"], body


def test_generation_details_pass_through_unchanged(server):
    """Outputs the engine sends only when asked (log probs, perf metrics, token counts) reach the ensemble's client
    as the engine sent them; the ones it was not asked for stay absent."""
    body = {"text_input": PROMPTS[0], "max_tokens": 8, "end_id": -1, "return_log_probs": True,
            "return_perf_metrics": True}
    ensemble = generate(server.http_url, ENSEMBLE, body)
    bls = generate(server.http_url, BLS, body)
    assert ensemble["text_output"] == bls["text_output"]
    assert np.allclose(ensemble["cum_log_probs"], bls["cum_log_probs"], atol=1e-5)
    assert np.allclose(ensemble["output_log_probs"], bls["output_log_probs"], atol=1e-5)
    assert ensemble["kv_cache_alloc_total_blocks"] >= 1 and ensemble["first_token_time_ns"] > 0
    assert "context_logits" not in ensemble and "generation_logits" not in ensemble
    plain = generate(server.http_url, ENSEMBLE, {"text_input": PROMPTS[0], "max_tokens": 8, "end_id": -1})
    assert "cum_log_probs" not in plain and "arrival_time_ns" not in plain


def test_a_batch_of_rows_keeps_each_rows_text(server):
    """Two rows in one gRPC request: each row's streamed responses carry its batch_index and add up to that row's
    text alone."""
    alone = [generate(server.http_url, ENSEMBLE, {"text_input": p, "max_tokens": 12, "end_id": -1})["text_output"]
             for p in PROMPTS]
    inputs = {"text_input": np.array([[p.encode()] for p in PROMPTS], dtype=object),
              "max_tokens": np.array([[12], [12]], np.int32), "end_id": np.array([[-1], [-1]], np.int32),
              "stream": np.array([[True], [True]])}
    result = grpc_stream(server.grpc_url, ENSEMBLE, inputs, ["text_output", "batch_index"], timeout=60)
    assert result.error is None, result.error
    texts = ["", ""]
    for response in result.responses:
        if "text_output" in response:
            row = int(response["batch_index"].reshape(-1)[0])
            texts[row] += b"".join(response["text_output"].reshape(-1)).decode()
    assert texts == alone


@pytest.mark.parametrize("sequence_id", [42, "conversation-7"])
def test_a_correlation_id_of_either_kind_is_carried_to_the_engine(server, sequence_id):
    """The handoff copies the request's correlation id, a number or a string, onto the engine request: neither kind
    fails the request."""
    inputs = {"text_input": np.array([[PROMPTS[0].encode()]], dtype=object), "max_tokens": np.array([[6]], np.int32),
              "end_id": np.array([[-1]], np.int32), "stream": np.array([[True]])}
    result = grpc_stream(server.grpc_url, ENSEMBLE, inputs, ["text_output"], timeout=60, sequence_id=sequence_id)
    assert result.error is None and result.completed, result.error
    text = b"".join(b"".join(r["text_output"].reshape(-1)) for r in result.responses).decode()
    assert text == generate(server.http_url, ENSEMBLE, {"text_input": PROMPTS[0], "max_tokens": 6,
                                                        "end_id": -1})["text_output"]


def test_an_engine_error_mid_generation_reaches_the_ensemble_client(server):
    with pytest.raises(HttpError, match="in ensemble 'ensemble', tensorrt_llm: internal error") as error:
        generate_stream(server.http_url, ENSEMBLE, {"text_input": "hi", "max_tokens": 10, "stream": True,
                                                    **ENGINE_FAILS_AT_THIRD_TOKEN}, timeout=30)
    assert "Traceback" not in error.value.message
    assert generate(server.http_url, ENSEMBLE, {"text_input": "still there?", "max_tokens": 3})["text_output"]


def test_a_bad_input_is_refused_by_name_through_the_handoff(server):
    """The engine's refusal reaches the client as the engine words it, with its code (400)."""
    with pytest.raises(HttpError) as error:
        generate(server.http_url, ENSEMBLE, {"text_input": "hi", "max_tokens": 3, "temperature": math.nan})
    assert error.value.status == 400, error.value
    assert "temperature: " in error.value.message and "must be a finite number" in error.value.message
    assert "Traceback" not in error.value.message
