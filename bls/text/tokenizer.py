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
from collections.abc import Sequence
from pathlib import Path

import jinja2
import numpy as np
from tokenizers import decoders
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

from bls.errors import InvalidRequest
from bls.text.chat import LLAMA31_TOOL_CHAT_TEMPLATE, Chat, ChatMessage, ToolCall, validate_chat
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
        # Byte-level BPE (every Llama 3 tokenizer): a token is a byte string, and decode() joins the tokens' bytes
        # and decodes them as UTF-8 with replacement (the ByteLevel decoder). Exact streamed text is defined on those
        # bytes (bls/text/detokenizer.py), so no other kind of tokenizer is served.
        if not (tokenizer.is_fast and isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel)):
            raise ValueError(f"{type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '')}) is not a "
                             "byte-level BPE tokenizer, as every Llama 3 tokenizer is: exact streamed text is defined "
                             "on token bytes")
        self._byte_of_char = {char: byte for byte, char in bytes_to_unicode().items()}
        self._token_bytes: dict[tuple[int, bool], bytes] = {}  # bounded by the vocabulary
        # encode() with split_special_tokens flips a flag on the shared Rust tokenizer and leaves it set,
        # so concurrent encodes with different settings (BLS threads) must not interleave.
        self._encode_lock = threading.Lock()
        # len(), not tokenizer.vocab_size: the latter (128000) leaves out the 256 special tokens.
        self.vocab_size = len(tokenizer)
        self.bos_id: int | None = tokenizer.bos_token_id
        self.special_ids = frozenset(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
        self._added_ids = frozenset(tokenizer.added_tokens_decoder)

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
        # Control tokens as they appear in a rendered template, longest first (a regex alternation takes the first
        # that matches). A client string can only form or hold one if it holds one of the fragments: for Llama 3's
        # "<|...|>" tokens "<|" or "|>"; for other vocabularies every client string counts.
        specials = sorted((tokenizer.convert_ids_to_tokens(i) for i in self.special_ids), key=len, reverse=True)
        self._special_token_ids = {token: tokenizer.convert_tokens_to_ids(token) for token in specials}
        self._special_token_pattern = re.compile("|".join(map(re.escape, specials)) or r"(?!)")
        llama_style = all(token.startswith("<|") and token.endswith("|>") for token in specials)
        self._special_token_fragments = ("<|", "|>") if llama_style else ("",)

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path) -> TokenizerBundle:
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

    def render_chat(self, chat: Chat | dict | Sequence[ChatMessage] | list[dict], field: str = "MESSAGES") -> str:
        """The prompt text, exactly as transformers renders it (generation prompt included)."""
        chat = validate_chat(chat if isinstance(chat, (Chat, dict)) else list(chat), field)
        return self._apply_template(chat, [m.template_dict() for m in chat.messages], chat.tools, field)

    def chat_template_for(self, chat: Chat) -> str | None:
        """The model's own template; for a conversation with tools when that template has none (it never reads
        `tools`: Llama 3.0's), the official Llama 3.1 tool-calling template (bls.text.chat)."""
        own = self.tokenizer.chat_template
        if chat.uses_tools and own and "tools" not in own:
            return LLAMA31_TOOL_CHAT_TEMPLATE
        return own

    def _apply_template(self, chat: Chat, conversation: list[dict], tools, field: str) -> str:
        template = self.chat_template_for(chat)
        if not template:
            raise InvalidRequest(field, "this model's tokenizer has no chat template; send QUERY text instead")
        try:
            return self.tokenizer.apply_chat_template(
                conversation, tools=list(tools) if tools is not None else None, chat_template=template,
                tokenize=False, add_generation_prompt=True)
        except jinja2.TemplateError as error:  # templates may refuse a conversation (role order, several calls...)
            raise InvalidRequest(field, f"the chat template refused these messages: {error}") from None

    def encode_chat(self, chat: Chat | dict | Sequence[ChatMessage] | list[dict], field: str = "MESSAGES") -> list[int]:
        """A conversation rendered with the model's template (bls.text.chat for tools), tokenized so that the
        template's control tokens are control tokens and every special-token string from the client (content, tool
        definitions, call names and arguments, results) is text.

        To tell the two apart, the conversation is rendered a second time with each client string that could hold
        a special-token string wrapped in markers made of a per-call random nonce in private-use characters.
        Removing the markers must give back the plain rendering, which proves the marked spans are exactly the
        client's text (templates that trim content get the markers around the trimmed content; JSON-dumped data
        keeps them inside its strings). A special-token string of the plain rendering is a control token only where
        no marked span overlaps it. The text between control tokens is encoded with special-token strings as text:
        transformers' own tokenization splits at the same control tokens, so ids equal transformers' for any
        conversation whose client text holds no special-token string.
        """
        chat = validate_chat(chat if isinstance(chat, (Chat, dict)) else list(chat), field)
        plain = self.render_chat(chat, field)
        data_spans = self._client_text_spans(chat, plain, field)
        ids: list[int] = []
        position = 0
        for match in self._special_token_pattern.finditer(plain):
            start, end = match.span()
            if any(start < span_end and span_start < end for span_start, span_end in data_spans):
                continue  # client text: encoded with the text around it
            if position < start:
                ids += self._encode(plain[position:start], add_special_tokens=False, split_special_tokens=True)
            ids.append(self._special_token_ids[match.group()])
            position = end
        if position < len(plain):
            ids += self._encode(plain[position:], add_special_tokens=False, split_special_tokens=True)
        return ids

    def _client_text_spans(self, chat: Chat, plain: str, field: str) -> list[tuple[int, int]]:
        """Where the client's strings that could hold a special-token string lie in `plain` ([start, end) pairs)."""
        texts = list(chat.data_texts())
        if not any(self._may_hold_special_token(text) for text in texts):
            return []
        while True:
            nonce = "".join(chr(0xE100 + secrets.randbelow(0x1700)) for _ in range(6))
            open_marker, close_marker = f"{nonce}\ue000", f"\ue001{nonce}"
            if not any(nonce in text for text in texts):
                break

        def mark(text: str) -> str:
            """Markers around the text without its outer whitespace, which stays outside them: the rendering unmarks
            to the plain one whether the template trims the text or not."""
            if not self._may_hold_special_token(text):
                return text
            core = text.strip()
            start = text.index(core) if core else 0
            return f"{text[:start]}{open_marker}{core}{close_marker}{text[start + len(core):]}"

        marked_tools = None if chat.tools is None else [_marked_json(t, mark) for t in chat.tools]
        marked = self._apply_template(chat, [_marked_message(m, mark) for m in chat.messages], marked_tools, field)
        parts = re.split(f"{re.escape(open_marker)}(.*?){re.escape(close_marker)}", marked, flags=re.DOTALL)
        if "".join(parts) != plain:
            raise InvalidRequest(
                field,
                "the chat template transforms client text in a way that cannot be tokenized safely "
                "(text must appear verbatim, trimmed or JSON-encoded)",
            )
        spans, position = [], 0
        # re.split with one group alternates: template, client text, template, ..., template.
        for index, part in enumerate(parts):
            if index % 2 == 1:
                spans.append((position, position + len(part)))
            position += len(part)
        return spans

    def _may_hold_special_token(self, text: str) -> bool:
        return any(fragment in text for fragment in self._special_token_fragments)

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
        for word, weight in zip(words, weights, strict=True):
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
    def token_bytes(self, ids: Sequence[int], skip_special_tokens: bool) -> bytes:
        """The bytes decode() turns into text: decode(ids) == token_bytes(ids).decode("utf-8", "replace"). A skipped
        special token is no bytes; a kept one is its text."""
        parts = []
        for token in ids:
            key = (int(token), skip_special_tokens)
            data = self._token_bytes.get(key)
            if data is None:
                if key[0] in self.special_ids and skip_special_tokens:
                    data = b""
                elif key[0] in self._added_ids:  # its text as it is, not byte-mapped
                    data = self.decode([key[0]], False).encode("utf-8")
                else:
                    data = bytes(self._byte_of_char[char] for char in self.tokenizer.convert_ids_to_tokens(key[0]))
                self._token_bytes[key] = data
            parts.append(data)
        return b"".join(parts)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        if self._rust_decode is not None:
            return self._rust_decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )


def _marked_message(message: ChatMessage, mark) -> dict:
    calls = tuple(ToolCall(mark(c.name), _marked_json(c.arguments, mark), c.id) for c in message.tool_calls)
    marked = ChatMessage(message.role, mark(message.content), calls, message.tool_call_id)
    return marked.template_dict()


def _marked_json(value, mark):
    """A JSON value with `mark` applied to every string in it, keys included."""
    if isinstance(value, str):
        return mark(value)
    if isinstance(value, dict):
        return {mark(key): _marked_json(item, mark) for key, item in value.items()}
    if isinstance(value, list):
        return [_marked_json(item, mark) for item in value]
    return value
