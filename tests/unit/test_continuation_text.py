"""Stateless streamed text (the ensemble's postprocessing): each response that needs it decoded with the last ids
before it (PRECEDING_IDS, as the handoff sends them), every other one alone, joins into exactly the full decode,
split characters, invalid bytes, special tokens and streams that end mid-character included."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from bls.contract import TEXT_END, TOKEN_TEXT_CLASSES_FILE, TokenTextClass
from bls.errors import InvalidRequest
from bls.text.detokenizer import PRECEDING_TOKENS, continuation_text, token_text_classes
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


def test_a_tokenizer_that_is_not_byte_level_is_refused():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from bls.text.tokenizer import TokenizerBundle

    backend = Tokenizer(models.WordPiece({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
    with pytest.raises(ValueError, match="is not a byte-level BPE tokenizer"):
        TokenizerBundle(PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]"), [1])


def test_the_tokens_bytes_are_what_decode_decodes(bundle):
    rng = random.Random(7)
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


def state(*rows) -> np.ndarray:
    """PRECEDING_IDS [batch, 1, n] from each batch row's ids (TEXT_END included where the row says so)."""
    return np.asarray(rows, np.int32).reshape(len(rows), 1, -1)


def test_postprocessing_with_the_stream_state_holds_and_completes(bundle):
    """As the handoff sends it: the preceding ids, then TEXT_END on the response that ends the stream."""
    emoji = [byte_token(bundle, byte) for byte in "😀".encode()]
    post = Postprocessor(bundle)
    outputs = []
    for position in range(4):
        batch, lengths = tokens(emoji[position : position + 1])
        preceding = emoji[:position] + ([TEXT_END] if position == 3 else [])
        outputs.append(post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths,
                             "PRECEDING_IDS": state(preceding)})["OUTPUT"][0])
    assert outputs == [b"", b"", b"", "😀".encode()]


def test_the_end_of_text_mark_ends_its_own_row_only(bundle):
    """Each row of PRECEDING_IDS says for itself whether it ends: a trailing TEXT_END completes that row's text (its
    incomplete character becomes U+FFFD, as a full decode ends); the row beside it, the same length, holds back."""
    emoji = [byte_token(bundle, byte) for byte in "😀".encode()]
    batch = np.asarray([[[emoji[2]]], [[emoji[2]]]], np.int32)
    lengths = np.asarray([[1], [1]], np.int32)
    post = Postprocessor(bundle)
    both = post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths,
                 "PRECEDING_IDS": state(emoji[:2] + [TEXT_END], [emoji[0], emoji[0], emoji[1]])})["OUTPUT"]
    assert both.tolist() == ["\ufffd".encode(), b""]


def test_a_row_of_the_mark_alone_is_nvidias_decode(bundle):
    """What the handoff sends where a stream is not one sequence (beams): [1, beam, 1] of TEXT_END, each beam decoded
    alone and complete, exactly as without PRECEDING_IDS."""
    pieces = [byte_token(bundle, byte) for byte in "東😀".encode()[:5]]
    batch = np.asarray([[pieces[:2] + [0], pieces[2:]]], np.int32)
    lengths = np.asarray([[2, 3]], np.int32)
    post = Postprocessor(bundle)
    alone = post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths})["OUTPUT"]
    marked = post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths,
                   "PRECEDING_IDS": np.full((1, 2, 1), TEXT_END, np.int32)})["OUTPUT"]
    assert marked.tolist() == alone.tolist() == ["\ufffd".encode(), "\ufffd\ufffd".encode()]


def test_postprocessing_refuses_a_malformed_stream_state_by_name(bundle):
    batch, lengths = tokens([1000])
    post = Postprocessor(bundle)
    for preceding in (np.zeros((2, 1, 3), np.int32),  # not TOKENS_BATCH's [batch, beam]
                      state([bundle.vocab_size]),  # outside the vocabulary
                      state([TEXT_END, 1000]),  # the mark is only ever last
                      state([1000, TEXT_END - 1])):  # no other negative id means anything
        with pytest.raises(InvalidRequest, match="PRECEDING_IDS"):
            post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths, "PRECEDING_IDS": preceding})


def test_the_handoff_keeps_as_many_preceding_ids_as_the_decode_needs():
    """relay/handoff.cc sends the last kPrecedingTokens ids: the number the invariant above is proved with."""
    source = (Path(__file__).resolve().parents[2] / "relay" / "handoff.cc").read_text()
    assert re.search(r"constexpr size_t kPrecedingTokens = (\d+);", source).group(1) == str(PRECEDING_TOKENS)


def stream_state(preceding: list[int], complete: bool) -> dict:
    """The handoff's stream state for one sequence, as postprocessing receives it."""
    ids = list(preceding) + ([TEXT_END] if complete else [])
    return {"PRECEDING_IDS": np.asarray(ids, np.int32).reshape(1, 1, len(ids))}


def handoff_sends_state(stateful: list[bool], ids: list[int], classes: bytes) -> bool:
    """relay/handoff.cc NeedsTextState's rule, written out to test what it implies (the handoff itself is tested
    through the server: tests/integration/test_handoff.py): the state goes with every response from the stream's
    first PARTIAL token on."""
    stateful[0] = stateful[0] or any(classes[token] == TokenTextClass.PARTIAL for token in ids)
    return stateful[0]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_postprocessing_of_what_the_handoff_sends_adds_up_to_the_full_decode(bundle, skip_special_tokens):
    """What the ensemble streams: one token a response (sometimes two, sometimes none: an end id after a split
    character), through Postprocessor, with the stream state only where the handoff's rule sends it (decoded alone
    elsewhere): joined == the full decode."""
    rng = random.Random(11)
    classes = token_text_classes(bundle, skip_special_tokens)
    lone_bytes = [byte_token(bundle, byte) for byte in range(0x80, 0x100)]
    words = [token for text in TEXTS for token in text_ids(bundle, text)]
    post = Postprocessor(bundle, skip_special_tokens=skip_special_tokens)
    alone = with_state = 0
    for _ in range(150):
        ids = [rng.choice([rng.choice(words), rng.choice(words), rng.choice(lone_bytes), EOT,
                           rng.randrange(bundle.vocab_size)]) for _ in range(rng.randint(1, 30))]
        pieces, position, stateful = [], 0, [False]
        while position < len(ids):
            size = min(rng.choice([0, 1, 1, 1, 1, 2]), len(ids) - position)
            chunk = ids[position : position + size]
            batch, lengths = tokens(chunk)
            state = {}
            if handoff_sends_state(stateful, chunk, classes):
                with_state += 1
                state = stream_state(ids[max(0, position - PRECEDING_TOKENS) : position], position + size == len(ids))
            else:
                alone += 1
            pieces.append(post({"TOKENS_BATCH": batch, "SEQUENCE_LENGTH": lengths, **state})["OUTPUT"][0].decode())
            position += size
        assert "".join(pieces) == bundle.decode(ids, skip_special_tokens), ids
    assert alone > 200 and with_state > 200  # both kinds of response were decoded


def test_the_token_text_classes_are_what_the_tokens_bytes_are(bundle):
    classes = token_text_classes(bundle, skip_special_tokens=True)
    assert len(classes) == bundle.vocab_size
    assert classes[text_ids(bundle, " the")[0]] == TokenTextClass.WHOLE
    assert classes[byte_token(bundle, 0xE6)] == TokenTextClass.PARTIAL  # the first byte of a CJK character
    assert classes[byte_token(bundle, 0x80)] == TokenTextClass.PARTIAL  # a lone continuation byte
    assert classes[EOT] == classes[BOT] == TokenTextClass.WHOLE  # skipped: no bytes, nothing pending
    kept = token_text_classes(bundle, skip_special_tokens=False)
    assert kept[EOT] == TokenTextClass.WHOLE  # kept, a special token is its text
    assert sum(1 for c in classes if c == TokenTextClass.PARTIAL) > 1000  # Llama 3: 1,352 of 128,256


def test_the_handoff_reads_the_token_text_classes_as_written():
    """relay/handoff.cc's file name and class bytes are bls/contract.py's."""
    source = (Path(__file__).resolve().parents[2] / "relay" / "handoff.cc").read_text()
    assert re.search(r'constexpr char kTokenTextClassesFile\[\] = "([^"]+)";', source).group(1) == \
        TOKEN_TEXT_CLASSES_FILE
    assert int(re.search(r"constexpr uint8_t kPartial = (\d+);", source).group(1)) == TokenTextClass.PARTIAL
    assert TokenTextClass.WHOLE == 0 and max(TokenTextClass) == TokenTextClass.PARTIAL  # handoff.cc refuses others


def test_the_handoff_marks_the_end_of_text_as_postprocessing_reads_it():
    """relay/handoff.cc's kTextEnd is bls/contract.py's TEXT_END, an id no vocabulary has."""
    source = (Path(__file__).resolve().parents[2] / "relay" / "handoff.cc").read_text()
    assert re.search(r"constexpr int32_t kTextEnd = (-?\d+);", source).group(1) == str(TEXT_END)
    assert TEXT_END < 0
