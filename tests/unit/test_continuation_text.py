"""Stateless streamed text (the ensemble's postprocessing): each response decoded with the last ids before it
(PRECEDING_IDS, as the handoff sends them) joins into exactly the full decode, split characters, invalid bytes,
special tokens and streams that end mid-character included."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from bls.errors import InvalidRequest
from bls.text.detokenizer import PRECEDING_TOKENS, continuation_text
from bls.text.postprocessing import Postprocessor
from tests.unit.test_detokenizer import TEXTS, byte_token, text_ids

EOT, BOT = 128009, 128000


def stream_pieces(bundle, ids, chunks, skip_special_tokens=True) -> list[str]:
    """Each chunk's text as the ensemble makes it: only the last PRECEDING_TOKENS ids before it, no other state."""
    pieces, position = [], 0
    for index, size in enumerate(chunks):
        preceding = ids[max(0, position - PRECEDING_TOKENS) : position]
        pieces.append(continuation_text(bundle, preceding, ids[position : position + size], index == len(chunks) - 1,
                                        skip_special_tokens))
        position += size
    assert position == len(ids)
    return pieces


def random_chunks(rng, length) -> list[int]:
    chunks = []
    while sum(chunks) < length or not chunks:
        chunks.append(rng.randint(0 if length == 0 else 1, 4))
    chunks[-1] -= sum(chunks) - length
    return chunks


def test_the_tokens_bytes_are_what_decode_decodes(bundle):
    rng = random.Random(7)
    assert bundle.byte_level
    for _ in range(300):
        ids = [rng.randrange(bundle.vocab_size) for _ in range(rng.randint(0, 12))]
        for skip in (True, False):
            assert bundle.token_bytes(ids, skip).decode("utf-8", "replace") == bundle.decode(ids, skip), ids


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_random_ids_add_up_to_the_full_decode(bundle, skip_special_tokens, seed):
    rng = random.Random(seed)
    lone_bytes = [byte_token(bundle, byte) for byte in range(0x80, 0x100)]
    for _ in range(150):
        pick = rng.choice([
            lambda: rng.randrange(bundle.vocab_size),  # anything, special tokens included
            lambda: rng.randrange(100_000, 128_000),  # rare tokens: many are pieces of characters
            lambda: rng.choice(lone_bytes),  # lone non-ASCII bytes: split characters, invalid sequences
            lambda: rng.choice(lone_bytes + [EOT, BOT]),  # special tokens inside characters
        ])
        ids = [pick() for _ in range(rng.randint(0, 40))]
        pieces = stream_pieces(bundle, ids, random_chunks(rng, len(ids)), skip_special_tokens)
        assert "".join(pieces) == bundle.decode(ids, skip_special_tokens), ids


@pytest.mark.parametrize("text", TEXTS)
def test_valid_text_streams_whole_characters_one_token_at_a_time(bundle, text):
    ids = text_ids(bundle, text)
    pieces = stream_pieces(bundle, ids, [1] * len(ids))
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_a_split_emoji_is_held_until_its_last_byte(bundle):
    ids = [byte_token(bundle, byte) for byte in "😀".encode()]
    assert stream_pieces(bundle, ids, [1, 1, 1, 1]) == ["", "", "", "😀"]


def test_a_stream_that_ends_mid_character_ends_as_the_full_decode(bundle):
    """max_tokens may cut a character: the unstreamed text ends in U+FFFD, and so does the streamed."""
    ids = text_ids(bundle, "東京") + [byte_token(bundle, byte) for byte in "😀".encode()[:3]]
    pieces = stream_pieces(bundle, ids, [1] * len(ids))
    assert "".join(pieces) == bundle.decode(ids, True) == "東京\ufffd"
    assert pieces[-1] == "\ufffd"


def test_bytes_that_never_complete_are_not_held_for_ever(bundle):
    """Invalid bytes are U+FFFD as soon as they are known invalid: a model emitting them still streams."""
    continuation = byte_token(bundle, 0x80)
    pieces = stream_pieces(bundle, [continuation] * 20, [1] * 20)
    assert pieces == ["\ufffd"] * 20


def test_a_character_across_many_skipped_special_tokens(bundle):
    """Skipped special tokens are no bytes: a character split around them still joins, within PRECEDING_TOKENS."""
    emoji = [byte_token(bundle, byte) for byte in "😀".encode()]
    ids = emoji[:2] + [EOT] * (PRECEDING_TOKENS - 3) + emoji[2:]
    assert "".join(stream_pieces(bundle, ids, [1] * len(ids))) == "😀"


def tokens(ids):
    return np.asarray([[ids]], np.int32), np.asarray([[len(ids)]], np.int32)


def test_postprocessing_without_the_stream_state_decodes_each_response_alone(bundle):
    """NVIDIA's contract: TOKENS_BATCH and SEQUENCE_LENGTH only, decoded as they are."""
    piece = [byte_token(bundle, "😀".encode()[0])]
    batch, lengths = tokens(piece)
    assert Postprocessor(bundle)({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths})["OUTPUT"][0] == "\ufffd".encode()


def test_postprocessing_with_the_stream_state_holds_and_completes(bundle):
    emoji = [byte_token(bundle, byte) for byte in "😀".encode()]
    post = Postprocessor(bundle)
    outputs = []
    for position in range(4):
        batch, lengths = tokens(emoji[position : position + 1])
        outputs.append(post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths,
                             "PRECEDING_IDS": np.asarray([[emoji[:position]]], np.int32).reshape(1, 1, position),
                             "TEXT_COMPLETE": np.asarray([[position == 3]])})["OUTPUT"][0])
    assert outputs == [b"", b"", b"", "😀".encode()]


def test_postprocessing_refuses_a_malformed_stream_state_by_name(bundle):
    batch, lengths = tokens([1000])
    post = Postprocessor(bundle)
    with pytest.raises(InvalidRequest, match="PRECEDING_IDS"):
        post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths, "PRECEDING_IDS": np.zeros((2, 1, 3), np.int32)})
    with pytest.raises(InvalidRequest, match="PRECEDING_IDS"):
        post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths,
              "PRECEDING_IDS": np.asarray([[[bundle.vocab_size]]], np.int32)})
    with pytest.raises(InvalidRequest, match="TEXT_COMPLETE"):
        post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths, "TEXT_COMPLETE": np.zeros((1, 2), bool)})


def test_the_handoff_keeps_as_many_preceding_ids_as_the_decode_needs():
    """relay/handoff.cc sends the last kPrecedingTokens ids: the number the invariant above is proved with."""
    source = (Path(__file__).resolve().parents[2] / "relay" / "handoff.cc").read_text()
    assert re.search(r"constexpr size_t kPrecedingTokens = (\d+);", source).group(1) == str(PRECEDING_TOKENS)


def stream_state(preceding: list[int], complete: bool) -> dict:
    """The handoff's stream state for one sequence, as postprocessing receives it."""
    return {"PRECEDING_IDS": np.asarray(preceding, np.int32).reshape(1, 1, len(preceding)),
            "TEXT_COMPLETE": np.asarray([[complete]])}


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_postprocessing_one_token_a_response_adds_up_to_the_full_decode(bundle, skip_special_tokens):
    """What the ensemble streams: one token a response, through Postprocessor (its cached path for whole tokens after
    a whole token, continuation_text otherwise), joined == the full decode."""
    rng = random.Random(11)
    lone_bytes = [byte_token(bundle, byte) for byte in range(0x80, 0x100)]
    words = [token for text in TEXTS for token in text_ids(bundle, text)]
    post = Postprocessor(bundle, skip_special_tokens=skip_special_tokens)
    for _ in range(150):
        ids = [rng.choice([rng.choice(words), rng.choice(words), rng.choice(lone_bytes), EOT,
                           rng.randrange(bundle.vocab_size)]) for _ in range(rng.randint(1, 30))]
        pieces = []
        for position, token in enumerate(ids):
            batch, lengths = tokens([token])
            state = stream_state(ids[max(0, position - PRECEDING_TOKENS) : position], position == len(ids) - 1)
            pieces.append(post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths, **state})["OUTPUT"][0].decode())
        assert "".join(pieces) == bundle.decode(ids, skip_special_tokens), ids
