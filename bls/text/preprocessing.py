"""The `preprocessing` model's logic: a batch of text requests -> the engine's id tensors (v0.14 contract).

Differences from upstream, all deliberate:
- MESSAGES (a JSON chat, with tools or not: bls.text.chat) is rendered with the tokenizer's chat template (with
  tools and a template without them, Llama 3.1's); QUERY is raw text. Either way
  there is exactly one BOS, and special-token strings in client text stay text (see bls.text.tokenizer).
- END_ID defaults to the token the model ends its turn with (generation_config.json), and the other eos
  ids are default stop sequences, so Llama 3 Instruct stops whatever its tokenizer_config says.
- Bad input is an InvalidRequest naming the tensor: nothing is truncated, skipped or guessed silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from bls.batch import BatchInputs
from bls.errors import InvalidRequest
from bls.lora_names import lora_task_ids
from bls.text.chat import parse_chat
from bls.text.tokenizer import TokenizerBundle
from bls.word_lists import stack_word_lists

Tensors = dict[str, np.ndarray]

QuerySpecialTokens = Literal["text", "parse"]


@dataclass(frozen=True)
class _Item:
    """One batch entry, encoded."""

    prompt_ids: list[int]
    decoder_ids: list[int]
    end_id: int
    pad_id: int
    bad_words: np.ndarray  # [2, N]
    stop_words: np.ndarray  # [2, N]
    embedding_bias: np.ndarray | None  # [vocab_size]


class Preprocessor:
    """`__call__` maps a request's input tensors (batch first) to every preprocessing output.

    add_special_tokens: add BOS to QUERY text (chat templates add their own).
    max_input_len: the engine's limit; a longer prompt is refused with both numbers (None: no limit).
    query_special_tokens: "text" (default) encodes special-token strings in QUERY as text; "parse" lets
        trusted clients send pre-rendered prompts with control tokens (a leading BOS string then
        replaces the BOS add_special_tokens would add).
    lora_adapters: the repository's LoRA adapters, {name: task id} (bls.lora_names): LORA_NAME selects one.
    """

    def __init__(
        self,
        bundle: TokenizerBundle,
        *,
        add_special_tokens: bool = True,
        max_input_len: int | None = None,
        query_special_tokens: QuerySpecialTokens = "text",
        lora_adapters: dict[str, int] | None = None,
    ):
        if query_special_tokens not in ("text", "parse"):
            raise ValueError(f"query_special_tokens must be 'text' or 'parse', not {query_special_tokens!r}")
        self.bundle = bundle
        self.add_special_tokens = add_special_tokens
        self.max_input_len = max_input_len
        self.parse_query_special_tokens = query_special_tokens == "parse"
        self.lora_adapters = lora_adapters or {}

    def __call__(self, inputs: Tensors) -> Tensors:
        if "REQUEST_OUTPUT_LEN" not in inputs:
            raise InvalidRequest("REQUEST_OUTPUT_LEN", "is required (max_tokens of the ensemble)")
        if ("QUERY" in inputs) == ("MESSAGES" in inputs):
            raise InvalidRequest("QUERY", "send exactly one of QUERY (text) and MESSAGES (JSON chat)")
        words_name, weights_name = "EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS"
        if (words_name in inputs) != (weights_name in inputs):
            missing, given = (weights_name, words_name) if words_name in inputs else (words_name, weights_name)
            raise InvalidRequest(missing, f"is required with {given}")

        output_len = np.asarray(inputs["REQUEST_OUTPUT_LEN"], np.int32).reshape(-1, 1)
        batch = output_len.shape[0]
        rows = BatchInputs(inputs, batch)
        items = []
        for index in range(batch):
            try:
                items.append(self._encode_item(rows, index, int(output_len[index, 0])))
            except InvalidRequest as error:
                if batch == 1:
                    raise
                raise InvalidRequest(error.field, f"item {index}: {error.problem}") from None

        input_id, input_len = _pad([item.prompt_ids for item in items], [item.pad_id for item in items])
        end_ids = np.array([[item.end_id] for item in items], np.int32)
        pad_ids = np.array([[item.pad_id] for item in items], np.int32)
        if "DECODER_QUERY" in inputs:
            decoder_id, decoder_len = _pad([item.decoder_ids for item in items], pad_ids[:, 0].tolist())
        else:
            # Upstream's shape for decoder-only models: one pad id per item, length 1.
            decoder_id, decoder_len = pad_ids.copy(), np.ones((batch, 1), np.int32)
        biases = [item.embedding_bias for item in items]
        if any(bias is not None for bias in biases):
            zeros = np.zeros(self.bundle.vocab_size, np.float32)
            embedding_bias = np.stack([zeros if bias is None else bias for bias in biases])
        else:
            embedding_bias = np.zeros((batch, 0), np.float32)

        outputs: Tensors = {
            "INPUT_ID": input_id,
            "REQUEST_INPUT_LEN": input_len,
            "DECODER_INPUT_ID": decoder_id,
            "REQUEST_DECODER_INPUT_LEN": decoder_len,
            "BAD_WORDS_IDS": stack_word_lists([item.bad_words for item in items]),
            "STOP_WORDS_IDS": stack_word_lists([item.stop_words for item in items]),
            "EMBEDDING_BIAS": embedding_bias,
            "REQUEST_OUTPUT_LEN": output_len,
            "OUT_END_ID": end_ids,
            "OUT_PAD_ID": pad_ids,
        }
        outputs.update(renamed_sampling_inputs(rows))
        task_ids = lora_task_ids(rows, self.lora_adapters, "LORA_NAME", "LORA_TASK_ID")
        if task_ids is not None:  # absent otherwise: the engine then runs the base model
            outputs["OUT_LORA_TASK_ID"] = task_ids
        if "PROMPT_TABLE_EXTRA_ID" in inputs:
            extra_ids = np.asarray(inputs["PROMPT_TABLE_EXTRA_ID"], np.uint64).reshape(batch, -1)[:, :1]
            # Ids past the vocabulary address prompt-table rows; the extra id tags those positions (for KV
            # cache reuse). The vocabulary is len(tokenizer): upstream's tokenizer.vocab_size (128000)
            # tagged Llama 3's special tokens too.
            outputs["OUT_PROMPT_TABLE_EXTRA_IDS"] = np.where(
                input_id >= self.bundle.vocab_size, extra_ids, np.uint64(0)
            ).astype(np.uint64)
        return outputs

    def _encode_item(self, rows: BatchInputs, row: int, output_len: int) -> _Item:
        if output_len <= 0:
            raise InvalidRequest("REQUEST_OUTPUT_LEN", f"must be > 0, got {output_len}")
        if rows.has("QUERY"):
            field = "QUERY"
            text = rows.text(field, row)
            if not text:
                raise InvalidRequest(field, "is empty")
            self._refuse_if_too_long(field, [text])
            prompt_ids = self.bundle.encode_text(
                text, add_special_tokens=self.add_special_tokens, parse_special_tokens=self.parse_query_special_tokens
            )
        else:
            field = "MESSAGES"
            chat = parse_chat(rows.text(field, row), field)
            self._refuse_if_too_long(field, list(chat.data_texts()))
            prompt_ids = self.bundle.encode_chat(chat, field)
        if self.max_input_len is not None and len(prompt_ids) > self.max_input_len:
            raise InvalidRequest(
                field, f"the prompt is {len(prompt_ids)} tokens, more than max_input_len {self.max_input_len}"
            )
        decoder_ids = []
        if rows.has("DECODER_QUERY"):
            decoder_ids = self.bundle.encode_text(
                rows.text("DECODER_QUERY", row), add_special_tokens=self.add_special_tokens
            )

        # -1 is the engine's "never stop at an end id" (benchmarks force max_tokens with it).
        end_id = self._token_id(rows, row, "END_ID", self.bundle.end_id, lowest=-1)
        pad_id = self._token_id(rows, row, "PAD_ID", self.bundle.pad_id, lowest=0)
        stop_words = self.bundle.word_list(
            rows.texts("STOP_WORDS_DICT", row), "STOP_WORDS_DICT", self.bundle.default_stop_sequences(end_id)
        )
        bad_words = self.bundle.word_list(rows.texts("BAD_WORDS_DICT", row), "BAD_WORDS_DICT")
        embedding_bias = None
        if rows.has("EMBEDDING_BIAS_WORDS"):
            embedding_bias = self.bundle.embedding_bias(
                rows.texts("EMBEDDING_BIAS_WORDS", row), rows.values("EMBEDDING_BIAS_WEIGHTS", row).tolist()
            )
        return _Item(prompt_ids, decoder_ids, end_id, pad_id, bad_words, stop_words, embedding_bias)

    def _refuse_if_too_long(self, field: str, texts: list[str]) -> None:
        """A cheap early refusal: tokenizing megabytes of text only to reject it costs seconds of CPU."""
        if self.max_input_len is None:
            return
        size = sum(len(text.encode()) for text in texts)
        if size > self.max_input_len * self.bundle.max_token_bytes:
            raise InvalidRequest(field, f"the prompt is {size} bytes, far more than max_input_len "
                                        f"{self.max_input_len} tokens can hold")

    def _token_id(self, rows: BatchInputs, row: int, name: str, default: int, lowest: int) -> int:
        value = rows.scalar(name, row, int, default)
        if not lowest <= value < self.bundle.vocab_size:
            raise InvalidRequest(name, f"{value} is outside [{lowest}, {self.bundle.vocab_size})")
        return value


def _pad(sequences: list[list[int]], pad_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad each sequence with its own pad id: ([batch, max(1, longest)], lengths [batch, 1])."""
    width = max(1, max(len(ids) for ids in sequences))
    padded = np.empty((len(sequences), width), np.int32)
    for row, (ids, pad_id) in enumerate(zip(sequences, pad_ids, strict=True)):
        padded[row, :] = pad_id
        padded[row, : len(ids)] = ids
    lengths = np.array([[len(ids)] for ids in sequences], np.int32)
    return padded, lengths


def renamed_sampling_inputs(rows: BatchInputs) -> Tensors:
    """OUT_SEED / OUT_MIN_TOKENS from the 1.2 name or v0.14's (SEED or RANDOM_SEED, MIN_TOKENS or
    MIN_LENGTH), present only when the client sent one. Both names with different values is an error:
    which one the client meant cannot be guessed."""
    outputs: Tensors = {}
    pairs = (("OUT_SEED", "SEED", "RANDOM_SEED", np.uint64), ("OUT_MIN_TOKENS", "MIN_TOKENS", "MIN_LENGTH", np.int32))
    for output, new_name, old_name, dtype in pairs:
        given = [name for name in (new_name, old_name) if rows.has(name)]
        if not given:
            continue
        columns = [np.array([rows.scalar(name, row, int) for row in range(rows.batch_size)]) for name in given]
        if len(columns) == 2 and not np.array_equal(*columns):
            raise InvalidRequest(new_name, f"is also given as {old_name} (its v0.14 name), with a different value")
        if dtype is np.int32 and (columns[0] < 0).any():
            raise InvalidRequest(given[0], f"must be >= 0, got {int(columns[0].min())}")
        outputs[output] = columns[0].astype(dtype).reshape(-1, 1)
    return outputs
