"""Exact streamed text from streamed token ids: one byte-level definition for every model that streams text.

Llama 3's tokenizers are byte-level BPE: a token is a byte string, and a decode is the tokens' bytes joined and
decoded as UTF-8 with replacement (`TokenizerBundle.token_bytes`; the bundle refuses any other tokenizer). A token
does not always end on a character boundary (emoji, CJK and accented letters are split across tokens), so decoding
each response's ids alone garbles them (upstream's non-accumulating streaming), and decoding everything so far at
every token costs O(length) per token (upstream's accumulate_tokens). Here the ids' bytes go through one
incremental UTF-8 decoder: it emits every complete character and holds the incomplete sequence at the end (at most
3 bytes), and `finish()` ends it as a full decode does (U+FFFD).

Invariant: "".join(push(...) for every chunk) + finish() == bundle.decode(all ids). Why: incremental decoding with
replacement gives the one-shot decode's text (a decoder restarts at every byte that is not a continuation byte and
holds only a valid incomplete prefix), and the one-shot decode of the bytes is the tokenizer's decode. Work per
token: its bytes (a cached lookup) through the decoder, whatever the length, and bytes that never complete are
replaced as they arrive, so text keeps flowing.

Its users, each with the same state: the BLS keeps one `IncrementalDetokenizer` per stream (bls/generation/
generator.py); the ensemble's postprocessing keeps no stream (its instances serve every stream), so the state travels
with the responses as the last few ids before each (PRECEDING_IDS, from the handoff, from a stream's first split
character on, told by `token_text_classes`), from which `continuation_text` rebuilds the held bytes.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Sequence

from bls.contract import TokenTextClass
from bls.text.tokenizer import TokenizerBundle

_UTF8_DECODER = codecs.getincrementaldecoder("utf-8")


class IncrementalDetokenizer:
    def __init__(self, bundle: TokenizerBundle, skip_special_tokens: bool = True, held: bytes = b""):
        """`held`: the incomplete UTF-8 sequence earlier ids ended with (pending_bytes), to continue their text."""
        self._bundle = bundle
        self._skip_special_tokens = skip_special_tokens
        self._decoder = _UTF8_DECODER("replace")
        if held:
            self._decoder.setstate((held, 0))

    def push(self, new_ids: Iterable[int]) -> str:
        """The text the new ids add (possibly ""; an incomplete character waits for the next ids)."""
        return self._decoder.decode(self._bundle.token_bytes(new_ids, self._skip_special_tokens))

    def finish(self) -> str:
        """The rest of the text, exactly as a full decode ends (U+FFFD for a character left incomplete)."""
        return self._decoder.decode(b"", final=True)


# Ids before a response that carry its held bytes: a pending UTF-8 sequence is at most 3 bytes and every token that
# is not a skipped special token is at least one byte, so 8 tokens hold it with room for 5 skipped special tokens
# inside one character. relay/handoff.cc keeps as many (kPrecedingTokens).
PRECEDING_TOKENS = 8


def continuation_text(bundle: TokenizerBundle, preceding_ids: Sequence[int], new_ids: Sequence[int], complete: bool,
                      skip_special_tokens: bool = True) -> str:
    """The text `new_ids` add to a sequence whose earlier ids end with `preceding_ids`, for a stream of which every
    earlier piece was made by this function: what an IncrementalDetokenizer that had pushed the earlier ids would
    return, then (if `complete`: no ids follow) its finish().

    Invariant: the pieces of a sequence joined == bundle.decode(all ids), given `preceding_ids` holds the last
    PRECEDING_TOKENS ids before each piece (or all of them): the decoder's only state is the pending bytes at the
    end of the earlier ids, and those are the preceding ids' pending tail (pending_bytes).
    """
    detokenizer = IncrementalDetokenizer(bundle, skip_special_tokens, pending_bytes(bundle, preceding_ids,
                                                                                    skip_special_tokens))
    text = detokenizer.push(new_ids)
    return text + detokenizer.finish() if complete else text


def pending_bytes(bundle: TokenizerBundle, ids: Sequence[int], skip_special_tokens: bool = True) -> bytes:
    """The incomplete UTF-8 sequence the ids' bytes end with (b"" if none). Their last 3 bytes decide it: it is at
    most 3 bytes and starts a character, where decoding is in step whatever came before."""
    count = 3  # tokens: at least one byte each, unless skipped
    while len(tail := bundle.token_bytes(ids[-count:], skip_special_tokens)) < 3 and count < len(ids):
        count += 3
    decoder = _UTF8_DECODER("replace")
    decoder.decode(tail[-3:], final=False)
    return decoder.getstate()[0]


def token_text_classes(bundle: TokenizerBundle, skip_special_tokens: bool) -> bytes:
    """Each token's TokenTextClass (bls/contract.py), a byte per id of the vocabulary: what the handoff needs to send
    a stream's state only from its first split character on (relay/handoff.cc NeedsTextState). PARTIAL: the token's
    bytes alone are not whole UTF-8 (part of a character)."""
    table = bytearray(TokenTextClass.WHOLE for _ in range(bundle.vocab_size))
    for token in range(bundle.vocab_size):
        try:
            bundle.token_bytes([token], skip_special_tokens).decode("utf-8")
        except UnicodeDecodeError:
            table[token] = TokenTextClass.PARTIAL
    return bytes(table)
