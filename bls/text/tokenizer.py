"""The tokenizer and what the model's own files say about it: ids in, ids out, one place.

Every text-to-ids step of the repository (prompts, chat messages, stop/bad words, embedding bias) and
every ids-to-text step goes through `TokenizerBundle`, so that the rules below hold everywhere:

- Client text is data. Special-token strings inside it (`<|eot_id|>`, `<|start_header_id|>`...) are
  encoded as ordinary text, never as control tokens, unless a trusted deployment opts into parsing them.
- Exactly one BOS: added by us for raw text, by the chat template for messages, never both.
- Decoding never "cleans up" spaces: that rewrite is not local (" ." -> "."), so streamed text would
  differ from non-streamed text; byte-level BPE round-trips without it.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from pathlib import Path
from typing import Sequence

import jinja2
import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from bls.errors import InvalidRequest
from bls.text.chat import ChatMessage, validate_chat_messages
from bls.word_lists import encode_word_list

# Meta's dedicated padding token (Llama 3.1+ vocabulary; the 3.0 vocabulary has a reserved token there).
LLAMA3_PAD_TOKEN = "<|finetune_right_pad_id|>"


class TokenizerBundle:
    """A tokenizer directory: the fast tokenizer plus generation_config.json's end-of-sequence ids."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, generation_eos_ids: Sequence[int]):
        self.tokenizer = tokenizer
        # The Rust tokenizer's own decode is what a fast tokenizer's decode() returns with
        # clean_up_tokenization_spaces=False (transformers 4.57's PreTrainedTokenizerFast._decode), without the
        # Python around it, which cost the BLS more than the decode itself on its per-token path.
        self._rust_decode = tokenizer.backend_tokenizer.decode if tokenizer.is_fast else None
        # encode() with split_special_tokens flips a flag on the shared Rust tokenizer and leaves it set,
        # so concurrent encodes with different settings (BLS threads) must not interleave.
        self._encode_lock = threading.Lock()
        # len(), not tokenizer.vocab_size: the latter (128000) leaves out the 256 special tokens.
        self.vocab_size = len(tokenizer)
        self.bos_id: int | None = tokenizer.bos_token_id
        self.special_ids = frozenset(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)

        eos_ids = tuple(generation_eos_ids) or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
        if not eos_ids:
            raise ValueError("the tokenizer directory names no end-of-sequence token")
        self.eos_ids = eos_ids
        # The default end id is the token the model ends its turn with. tokenizer_config.json's eos_token
        # is the model's own statement of that, so it wins when generation_config agrees it is an eos id.
        # Otherwise take the last eos id: Meta lists the base model's <|end_of_text|> first and the chat
        # turn end <|eot_id|> last. Whichever is chosen, the other eos ids still stop generation as
        # default stop sequences (see default_stop_sequences), so Llama 3 stops with either snapshot.
        tokenizer_eos = tokenizer.eos_token_id
        self.end_id: int = tokenizer_eos if tokenizer_eos in eos_ids else eos_ids[-1]
        # Padding fills INPUT_ID beyond a request's length and output_ids beyond sequence_length; the engine
        # never reads it. A token the model neither reads nor generates keeps padding distinguishable from
        # a real end of sequence in those outputs; the end id (upstream's choice) is the last resort.
        self.pad_id: int = self._default_pad_id()
        # Byte-level BPE: one vocabulary character is one byte, so this bounds the bytes a token covers.
        # A text of more than max_input_len * max_token_bytes bytes cannot fit: refused before tokenizing.
        self.max_token_bytes: int = max(len(token) for token in tokenizer.get_vocab())

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path) -> "TokenizerBundle":
        tokenizer_dir = Path(tokenizer_dir)
        # fix_mistral_regex=False silences a spurious Mistral-regex warning of transformers 4.57.3 for local
        # checkpoints it saved; Llama 3's pre-tokenizer pattern is not affected.
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), fix_mistral_regex=False)
        eos_ids: list[int] = []
        generation_config = tokenizer_dir / "generation_config.json"
        if generation_config.is_file():
            configured = json.loads(generation_config.read_text()).get("eos_token_id")
            if configured is not None:
                eos_ids = [configured] if isinstance(configured, int) else list(configured)
        return cls(tokenizer, eos_ids)

    def _default_pad_id(self) -> int:
        if self.tokenizer.pad_token_id is not None:
            return self.tokenizer.pad_token_id
        pad = self.tokenizer.convert_tokens_to_ids(LLAMA3_PAD_TOKEN)
        if isinstance(pad, int) and pad != self.tokenizer.unk_token_id and pad in self.special_ids:
            return pad
        return self.end_id

    def default_stop_sequences(self, end_id: int) -> list[list[int]]:
        """The eos ids other than `end_id`, each a one-token stop sequence.

        end_id -1 means "never stop at an end token" (benchmarks use it to force max_tokens), so no eos
        id is added then either.
        """
        if end_id == -1:
            return []
        return [[eos] for eos in self.eos_ids if eos != end_id]

    # ------------------------------------------------------------------------------------------------
    # text -> ids
    # ------------------------------------------------------------------------------------------------
    def _encode(self, text: str, *, add_special_tokens: bool, split_special_tokens: bool) -> list[int]:
        with self._encode_lock:
            return self.tokenizer(
                text, add_special_tokens=add_special_tokens, split_special_tokens=split_special_tokens
            )["input_ids"]

    def encode_text(self, text: str, *, add_special_tokens: bool, parse_special_tokens: bool = False) -> list[int]:
        """A raw prompt. Special-token strings are text unless `parse_special_tokens` (trusted clients).

        With add_special_tokens there is exactly one BOS: a pre-rendered prompt that already starts with
        the BOS string (parse mode) gets no second one.
        """
        if not parse_special_tokens:
            return self._encode(text, add_special_tokens=add_special_tokens, split_special_tokens=True)
        already_has_bos = self.tokenizer.bos_token is not None and text.startswith(self.tokenizer.bos_token)
        return self._encode(
            text, add_special_tokens=add_special_tokens and not already_has_bos, split_special_tokens=False
        )

    def render_chat(self, messages: Sequence[ChatMessage], field: str = "MESSAGES") -> str:
        """The prompt text, exactly as transformers renders it (generation prompt included)."""
        return self._apply_template([{"role": m.role, "content": m.content} for m in messages], field)

    def _apply_template(self, conversation: list[dict[str, str]], field: str) -> str:
        try:
            return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        except jinja2.TemplateError as error:  # templates may refuse a conversation (role order...)
            raise InvalidRequest(field, f"the chat template refused these messages: {error}") from None

    def encode_chat(self, messages: Sequence[ChatMessage] | list[dict], field: str = "MESSAGES") -> list[int]:
        """Chat messages rendered with the tokenizer's own template.

        The template's control tokens are control tokens; special-token strings inside message content
        are text. To tell the two apart, the chat is rendered a second time with every content wrapped
        in markers made of a per-call random nonce in private-use characters; the markers split the
        rendering into template parts and content parts, which are encoded separately. Removing the
        markers must give back the plain rendering, which proves the split is faithful (templates that
        trim content get the markers around the trimmed content). Template and content parts are encoded
        separately; in Llama 3's template every content sits between "\n\n" and a control token, where
        the pre-tokenizer splits anyway, so benign content gets exactly transformers' ids.
        """
        if not self.tokenizer.chat_template:
            raise InvalidRequest(field, "this model's tokenizer has no chat template; send QUERY text instead")
        messages = validate_chat_messages(list(messages), field)
        plain = self.render_chat(messages, field)
        marked, open_marker, close_marker = self._render_marked(messages, plain, field)
        parts = re.split(f"{re.escape(open_marker)}(.*?){re.escape(close_marker)}", marked, flags=re.DOTALL)
        ids: list[int] = []
        # re.split with one group alternates: template, content, template, ..., template.
        for index, part in enumerate(parts):
            if not part:
                continue
            is_content = index % 2 == 1
            ids += self._encode(part, add_special_tokens=False, split_special_tokens=is_content)
        return ids

    def _render_marked(self, messages: Sequence[ChatMessage], plain: str, field: str) -> tuple[str, str, str]:
        while True:
            nonce = "".join(chr(0xE100 + secrets.randbelow(0x1700)) for _ in range(6))
            open_marker, close_marker = f"{nonce}\ue000", f"\ue001{nonce}"
            if not any(nonce in m.content for m in messages):
                break
        for wrap in (lambda content: content, str.strip):
            conversation = [
                {"role": m.role, "content": f"{open_marker}{wrap(m.content)}{close_marker}"} for m in messages
            ]
            marked = self._apply_template(conversation, field)
            if marked.replace(open_marker, "").replace(close_marker, "") == plain:
                return marked, open_marker, close_marker
        raise InvalidRequest(
            field,
            "the chat template transforms message content in a way that cannot be tokenized safely "
            "(content must appear verbatim or trimmed)",
        )

    def _word_forms(self, word: str, field: str) -> list[tuple[int, ...]]:
        """The ids of a non-empty word as it appears in generated text: as is, and after a space."""
        forms = [word] if word[0].isspace() else [word, " " + word]
        encoded = [tuple(self._encode(form, add_special_tokens=False, split_special_tokens=False)) for form in forms]
        if not all(encoded):
            raise InvalidRequest(field, f"word {word!r} encodes to no tokens")
        return encoded

    def word_list(
        self, words: Sequence[str], field: str, extra_sequences: Sequence[Sequence[int]] = ()
    ) -> np.ndarray:
        """Stop or bad words of one request in the engine's [2, N] int32 format.

        Row 0 holds every sequence's ids back to back, row 1 each sequence's end offset; ids are padded
        with 0 and offsets with -1. A word is matched against generated tokens, where it usually follows
        a space, so each word contributes itself and its leading-space form (deduplicated). Special-token
        strings in words are parsed: a stop word "<|eot_id|>" means the control token (words never reach
        the prompt, so there is nothing to inject). Empty strings mean "no word" (upstream clients send
        [""] for an empty list). `extra_sequences` are id sequences added as they are (default stops).
        """
        sequences = [form for word in words if word for form in self._word_forms(word, field)]
        sequences += [tuple(sequence) for sequence in extra_sequences]
        sequences = list(dict.fromkeys(sequences))

        return encode_word_list(sequences)

    def embedding_bias(
        self,
        words: Sequence[str],
        weights: Sequence[float],
        words_field: str = "EMBEDDING_BIAS_WORDS",
        weights_field: str = "EMBEDDING_BIAS_WEIGHTS",
    ) -> np.ndarray:
        """A [vocab_size] float32 logit bias: each word's weight added once to every id of its forms.

        Words are encoded without special tokens (upstream biased the BOS id along with every word) and in
        both the forms word_list uses. Empty words are skipped, like in word lists.
        """
        if len(words) != len(weights):
            raise InvalidRequest(weights_field, f"has {len(weights)} weights for {len(words)} words in {words_field}")
        bias = np.zeros(self.vocab_size, np.float32)
        for word, weight in zip(words, weights):
            if not word:
                continue
            if not np.isfinite(weight):
                raise InvalidRequest(weights_field, f"weight {weight} for {word!r} is not finite")
            ids = {token for form in self._word_forms(word, words_field) for token in form}
            bias[sorted(ids)] += np.float32(weight)
        return bias

    # ------------------------------------------------------------------------------------------------
    # ids -> text
    # ------------------------------------------------------------------------------------------------
    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        if self._rust_decode is not None:
            return self._rust_decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )
