"""Postprocessor: output ids -> text, with the real tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from bls.errors import InvalidRequest
from bls.text.postprocessing import Postprocessor

EOT, PAD = 128009, 128004
ANSWER = "Bonjour ! 😀 東京 , ça va ."


def tokens_batch(beams: list[list[int]], fill: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """[1, beam, len] padded with `fill` past each beam's length, and [1, beam] lengths."""
    width = max(len(ids) for ids in beams) + 3
    tokens = np.full((1, len(beams), width), fill, np.int32)
    for k, ids in enumerate(beams):
        tokens[0, k, : len(ids)] = ids
    return tokens, np.array([[len(ids) for ids in beams]], np.int32)


@pytest.mark.parametrize("exclude_input_in_output", [True, False])
def test_decodes_what_the_engine_returned(bundle, exclude_input_in_output):
    prompt = bundle.encode_chat([{"role": "user", "content": "Greet me in French."}])
    answer = bundle.encode_text(ANSWER, add_special_tokens=False) + [EOT]
    returned = answer if exclude_input_in_output else prompt + answer
    tokens, lengths = tokens_batch([returned])
    outputs = Postprocessor(bundle, skip_special_tokens=True)({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths})
    expected = ANSWER if exclude_input_in_output else "user\n\nGreet me in French.assistant\n\n" + ANSWER
    assert outputs["OUTPUT"].dtype == object and outputs["OUTPUT"].shape == (1,)  # upstream: [batch * beam]
    assert outputs["OUTPUT"][0].decode("utf-8") == expected  # spaces before punctuation kept


def test_beams_and_batch(bundle):
    beams = [bundle.encode_text(text, add_special_tokens=False) for text in ("one", "two three", "")]
    tokens, lengths = tokens_batch(beams, fill=PAD)
    tokens = np.concatenate([tokens, tokens[:, ::-1]])
    lengths = np.concatenate([lengths, lengths[:, ::-1]])
    outputs = Postprocessor(bundle)({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths})
    assert outputs["OUTPUT"].shape == (6,)  # batch-major, one string per beam: upstream's 1-D layout
    assert outputs["OUTPUT"].tolist() == [b"one", b"two three", b"", b"", b"two three", b"one"]


def test_special_tokens_kept_when_asked(bundle):
    ids = bundle.encode_text("Hi", add_special_tokens=True) + [EOT]
    tokens, lengths = tokens_batch([ids])
    kept = Postprocessor(bundle, skip_special_tokens=False)({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths})
    skipped = Postprocessor(bundle, skip_special_tokens=True)({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths})
    assert kept["OUTPUT"][0] == b"<|begin_of_text|>Hi<|eot_id|>"
    assert skipped["OUTPUT"][0] == b"Hi"


def test_split_characters_become_replacement_characters(bundle):
    ids = bundle.encode_text("😀", add_special_tokens=False)
    assert len(ids) > 1  # byte-level BPE splits this emoji
    tokens, lengths = tokens_batch([ids[:-1]])
    outputs = Postprocessor(bundle)({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths})
    assert outputs["OUTPUT"][0].decode("utf-8") == bundle.decode(ids[:-1], True) == "\ufffd"


@pytest.mark.parametrize(
    "tokens, lengths, field, problem",
    [
        (np.zeros((1, 1, 4), np.int32), np.array([[5]], np.int32), "SEQUENCE_LENGTH", "within [0, 4]"),
        (np.zeros((1, 1, 4), np.int32), np.array([[-1]], np.int32), "SEQUENCE_LENGTH", "within [0, 4]"),
        (np.zeros((1, 2, 4), np.int32), np.array([[1]], np.int32), "SEQUENCE_LENGTH", "does not match"),
        (np.zeros((1, 4), np.int32), np.array([[1]], np.int32), "TOKENS_BATCH", "[batch, beam, len]"),
        (np.array([[[5, -1, 7]]], np.int32), np.array([[3]], np.int32), "TOKENS_BATCH", "token id -1"),
        (np.array([[[5, 128256]]], np.int32), np.array([[2]], np.int32), "TOKENS_BATCH", "token id 128256"),
    ],
)
def test_invalid_inputs(bundle, tokens, lengths, field, problem):
    with pytest.raises(InvalidRequest) as caught:
        Postprocessor(bundle)({"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths})
    assert caught.value.field == field and problem in caught.value.problem


def test_a_batch_of_requests_each_decoded_alone(bundle):
    """decode_each (the ensemble's batched requests): each request's text is what decoding it alone gives, a lone
    piece of a split character included (U+FFFD, as upstream), and a bad request fails alone."""
    emoji = bundle.encode_text("😀", add_special_tokens=False)
    words = bundle.encode_text(" ça va", add_special_tokens=False)
    post = Postprocessor(bundle)
    batch = [tokens_batch([[token]]) for token in emoji + words + emoji] + [tokens_batch([words])]
    batch.insert(2, (np.array([[[5, 128256]]], np.int32), np.array([[2]], np.int32)))
    results = post.decode_each([{"TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": lengths} for tokens, lengths in batch])
    assert isinstance(results[2], InvalidRequest) and results[2].field == "TOKENS_BATCH"
    texts = [result["OUTPUT"].tolist() for i, result in enumerate(results) if i != 2]
    singles = emoji + words + emoji
    assert texts[:-1] == [[bundle.decode([token], True).encode("utf-8")] for token in singles]
    assert texts[0] == ["\ufffd".encode("utf-8")]  # one piece of the emoji alone
    assert texts[-1] == [" ça va".encode()]
    assert texts[: len(emoji)] == texts[len(emoji) + len(words): -1]  # the remembered texts are the same


def test_a_batch_whose_every_request_is_bad(bundle):
    results = Postprocessor(bundle).decode_each([
        {"TOKENS_BATCH": np.array([[[-1]]], np.int32), "SEQUENCE_LENGTH": np.array([[1]], np.int32)},
        {"TOKENS_BATCH": np.zeros((1, 1, 2), np.int32)},
    ])
    assert [(r.field, r.problem) for r in results] == [
        ("TOKENS_BATCH", f"token id -1 is outside the vocabulary [0, {bundle.vocab_size})"),
        ("SEQUENCE_LENGTH", "is required")]


def test_a_response_without_tokens_decodes_to_empty_text(bundle):
    """A stream's last engine response may carry no token (shape [1, 1, 0]: the end id was not returned)."""
    outputs = Postprocessor(bundle)({"TOKENS_BATCH": np.zeros((1, 1, 0), np.int32),
                                     "SEQUENCE_LENGTH": np.zeros((1, 1), np.int32)})
    assert outputs["OUTPUT"].reshape(-1).tolist() == [b""]
