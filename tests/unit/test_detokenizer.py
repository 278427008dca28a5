"""IncrementalDetokenizer: streamed deltas add up to the full decode, at bounded work per token (byte-level)."""

from __future__ import annotations

import random

import pytest
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

from bls.text.detokenizer import IncrementalDetokenizer
from bls.text.tokenizer import TokenizerBundle

EOT = 128009
TEXTS = [
    "Hello world! How are you today?",
    "  leading spaces, trailing spaces  ",
    "Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧‍👦 done",
    "日本語のテキストと中文文本，还有한국어.",
    "Mixed: naïve café — “quotes” … Ω≈ç√ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "code:\n\tdef f(x):\n\t\treturn x ** 2  # 二乗\n",
]


@pytest.fixture()
def decoded_lengths(bundle, monkeypatch) -> list[int]:
    """How many ids each lookup of the detokenizer receives (a spy on the real token_bytes, its only work)."""
    lengths: list[int] = []
    real_token_bytes = bundle.token_bytes

    def counting_token_bytes(ids, skip_special_tokens):
        ids = list(ids)
        lengths.append(len(ids))
        return real_token_bytes(ids, skip_special_tokens)

    monkeypatch.setattr(bundle, "token_bytes", counting_token_bytes)
    return lengths


def byte_token(bundle: TokenizerBundle, byte: int) -> int:
    """The id of the token that is this single byte."""
    return bundle.tokenizer.convert_tokens_to_ids(bytes_to_unicode()[byte])


def text_ids(bundle: TokenizerBundle, text: str) -> list[int]:
    return bundle.encode_text(text, add_special_tokens=False)


def stream(bundle, ids, skip_special_tokens, chunk_sizes=None) -> tuple[list[str], str]:
    detokenizer = IncrementalDetokenizer(bundle, skip_special_tokens)
    deltas, position = [], 0
    for size in chunk_sizes or [1] * len(ids):
        deltas.append(detokenizer.push(ids[position : position + size]))
        position += size
    assert position >= len(ids)
    return deltas, detokenizer.finish()


@pytest.mark.parametrize("skip_special_tokens", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_random_ids_add_up_to_the_full_decode(bundle, skip_special_tokens, seed):
    rng = random.Random(seed)
    for _ in range(150):
        length = rng.randint(0, 40)
        pick = rng.choice(
            [
                lambda: rng.randrange(bundle.vocab_size),  # anything, special tokens included
                lambda: rng.randrange(100_000, 128_000),  # rare tokens: many are pieces of characters
                lambda: byte_token(bundle, rng.randrange(0x80, 0x100)),  # lone non-ASCII bytes
            ]
        )
        ids = [pick() for _ in range(length)]
        chunks = []
        while sum(chunks) < length:
            chunks.append(rng.randint(1, 5))
        deltas, rest = stream(bundle, ids, skip_special_tokens, chunks)
        assert "".join(deltas) + rest == bundle.decode(ids, skip_special_tokens), ids


@pytest.mark.parametrize("text", TEXTS)
def test_valid_text_streams_whole_characters(bundle, text):
    ids = bundle.encode_text(text, add_special_tokens=False)
    deltas, rest = stream(bundle, ids, skip_special_tokens=True)
    assert "".join(deltas) + rest == text
    assert rest == ""  # valid text ends on a character: nothing left for finish()
    assert not any("\ufffd" in delta for delta in deltas)  # a split character is held back, never garbled


def test_a_split_character_is_held_until_complete(bundle):
    emoji = text_ids(bundle, "😀")
    assert len(emoji) == 2  # byte-level BPE splits it: each token alone decodes to U+FFFD
    ids = text_ids(bundle, "ok:") + emoji + text_ids(bundle, "!")
    deltas, rest = stream(bundle, ids, skip_special_tokens=True)
    assert deltas[-3:] == ["", "😀", "!"] and rest == ""


def test_leading_space_of_each_word_is_kept(bundle):
    ids = bundle.encode_text(" one two three", add_special_tokens=False)
    deltas, _ = stream(bundle, ids, skip_special_tokens=True)
    assert deltas == [" one", " two", " three"]


@pytest.mark.parametrize(
    "skip_special_tokens, expected", [(True, "Hi 😀!"), (False, "<|begin_of_text|>Hi 😀<|eot_id|>!")]
)
def test_special_tokens(bundle, skip_special_tokens, expected):
    emoji = text_ids(bundle, " 😀")
    ids = bundle.encode_text("Hi", add_special_tokens=True) + emoji + [EOT] + text_ids(bundle, "!")
    deltas, rest = stream(bundle, ids, skip_special_tokens)
    assert "".join(deltas) + rest == expected == bundle.decode(ids, skip_special_tokens)
    # A skipped special token between the pieces of a character does not break the character.
    split = emoji[:1] + [EOT] + emoji[1:]
    deltas, rest = stream(bundle, split, skip_special_tokens=True)
    assert "".join(deltas) + rest == " 😀"


def test_finish_flushes_an_incomplete_character_like_a_full_decode(bundle):
    ids = text_ids(bundle, "ok") + text_ids(bundle, "😀")[:1]
    deltas, rest = stream(bundle, ids, skip_special_tokens=True)
    assert "".join(deltas) == "ok"
    assert rest == "\ufffd"
    assert "".join(deltas) + rest == bundle.decode(ids, True)
    detokenizer = IncrementalDetokenizer(bundle)
    assert detokenizer.push([]) == "" and detokenizer.push([EOT]) == "" and detokenizer.finish() == ""


def test_work_per_token_does_not_grow(bundle, decoded_lengths):
    text = " ".join(TEXTS) * 20
    ids = bundle.encode_text(text, add_special_tokens=False)
    assert len(ids) > 1000
    deltas, rest = stream(bundle, ids, skip_special_tokens=True)
    assert "".join(deltas) + rest == text
    assert max(decoded_lengths) <= 8  # a full re-decode would reach len(ids)
    assert sum(decoded_lengths) <= 3 * len(ids)


@pytest.mark.parametrize("byte_pattern", [[0x80], [0xE2], [0xF0, 0x9F], [0xC3, 0x80, 0xE2]])
def test_work_stays_bounded_on_bytes_that_never_complete(bundle, decoded_lengths, byte_pattern):
    """A model looping on broken bytes: the text always ends in U+FFFD, yet the window stays small."""
    ids = [byte_token(bundle, byte) for byte in byte_pattern] * 300
    deltas, rest = stream(bundle, ids, skip_special_tokens=False)
    work = list(decoded_lengths)
    assert "".join(deltas) + rest == bundle.decode(ids, False)
    assert max(work) <= 8
    assert sum(work) <= 16 * len(ids)  # a few small decodes per token, whatever the length
    assert sum(1 for delta in deltas if delta) > len(ids) // 4  # text keeps flowing, not held to the end
