"""Preprocessor: v0.14 preprocessing outputs from numpy inputs, with the real tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.utils import triton_to_np_dtype

from bls.contract import PREPROCESSING
from bls.errors import InvalidRequest
from bls.text.preprocessing import Preprocessor

BOS, END_OF_TEXT, EOT, PAD = 128000, 128001, 128009, 128004


@pytest.fixture(scope="module")
def preprocess(bundle) -> Preprocessor:
    return Preprocessor(bundle, add_special_tokens=True, max_input_len=64)


def strings(*rows: list) -> np.ndarray:
    """A [batch, N] BYTES tensor as Triton hands it over (object array of bytes)."""
    return np.array([[v if isinstance(v, bytes) else v.encode() for v in row] for row in rows], dtype=object)


def request(query=None, messages=None, output_len=16, batch=1, **extra) -> dict[str, np.ndarray]:
    inputs = {"REQUEST_OUTPUT_LEN": np.full((batch, 1), output_len, np.int32)}
    if query is not None:
        inputs["QUERY"] = strings(*[[query]] * batch)
    if messages is not None:
        inputs["MESSAGES"] = strings(*[[json.dumps(messages)]] * batch)
    inputs.update(extra)
    return inputs


def check_contract(outputs: dict[str, np.ndarray], batch: int) -> None:
    for name, array in outputs.items():
        spec = PREPROCESSING.output(name)
        assert array.dtype == triton_to_np_dtype(spec.data_type.removeprefix("TYPE_").replace("STRING", "BYTES")), name
        assert array.shape[0] == batch and array.ndim == len(spec.dims) + 1, name
        for size, dim in zip(array.shape[1:], spec.dims, strict=True):
            assert dim == -1 or size == dim, name


def test_query_outputs(bundle, preprocess):
    outputs = preprocess(request("Tell me a joke."))
    check_contract(outputs, batch=1)
    expected = bundle.encode_text("Tell me a joke.", add_special_tokens=True)
    assert outputs["INPUT_ID"].tolist() == [expected] and expected[0] == BOS
    assert outputs["REQUEST_INPUT_LEN"].tolist() == [[len(expected)]]
    assert outputs["DECODER_INPUT_ID"].tolist() == [[PAD]]
    assert outputs["REQUEST_DECODER_INPUT_LEN"].tolist() == [[1]]
    assert outputs["OUT_END_ID"].tolist() == [[EOT]]
    assert outputs["OUT_PAD_ID"].tolist() == [[PAD]]
    assert outputs["REQUEST_OUTPUT_LEN"].tolist() == [[16]]
    # The other eos id stops generation by default.
    assert outputs["STOP_WORDS_IDS"].tolist() == [[[END_OF_TEXT], [1]]]
    assert outputs["BAD_WORDS_IDS"].tolist() == [[[0], [-1]]]
    assert outputs["EMBEDDING_BIAS"].shape == (1, 0)
    assert "OUT_PROMPT_TABLE_EXTRA_IDS" not in outputs


def test_messages_use_the_chat_template(bundle, preprocess):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|eot_id|>"}]
    outputs = preprocess(request(messages=messages))
    ids = outputs["INPUT_ID"][0].tolist()
    assert ids == bundle.encode_chat(messages)
    assert ids.count(BOS) == 1  # the template's BOS; add_special_tokens adds none to chats
    assert ids.count(EOT) == 2  # the template's turn ends only: the one in the content is text
    assert bundle.decode(ids, skip_special_tokens=False) == bundle.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_batch_is_right_padded_per_item(bundle, preprocess):
    inputs = {
        "QUERY": strings(["Hi"], ["A much longer question about the weather"]),
        "REQUEST_OUTPUT_LEN": np.array([[4], [8]], np.int32),
        "END_ID": np.array([[EOT], [END_OF_TEXT]], np.int32),
        "PAD_ID": np.array([[7], [PAD]], np.int32),
        "STOP_WORDS_DICT": strings(["Jonathan", ""], ["", ""]),
    }
    outputs = preprocess(inputs)
    check_contract(outputs, batch=2)
    short = bundle.encode_text("Hi", add_special_tokens=True)
    long = bundle.encode_text("A much longer question about the weather", add_special_tokens=True)
    assert outputs["INPUT_ID"].tolist() == [short + [7] * (len(long) - len(short)), long]
    assert outputs["REQUEST_INPUT_LEN"].tolist() == [[len(short)], [len(long)]]
    assert outputs["OUT_END_ID"].tolist() == [[EOT], [END_OF_TEXT]]
    assert outputs["DECODER_INPUT_ID"].tolist() == [[7], [PAD]]
    assert outputs["REQUEST_OUTPUT_LEN"].tolist() == [[4], [8]]
    stop = outputs["STOP_WORDS_IDS"]
    jonathan = bundle.word_list(["Jonathan"], "x", [[END_OF_TEXT]])
    assert stop[0, :, : jonathan.shape[1]].tolist() == jonathan.tolist()
    # Item 1 ends at <|end_of_text|>, so <|eot_id|> becomes its default stop word.
    assert stop[1, 0, 0] == EOT and stop[1, 1].tolist() == [1] + [-1] * (stop.shape[2] - 1)
    assert (stop[1, 0, 1:] == 0).all()


def test_end_id_minus_one_disables_default_stops(preprocess):
    outputs = preprocess(request("Hi", END_ID=np.array([[-1]], np.int32)))
    assert outputs["OUT_END_ID"].tolist() == [[-1]]
    assert outputs["STOP_WORDS_IDS"].tolist() == [[[0], [-1]]]


def test_upstream_client_inputs(bundle, preprocess):
    """end_to_end_test.py sends [[""]] word lists; the words are "none"."""
    outputs = preprocess(request("Hi", BAD_WORDS_DICT=strings([""]), STOP_WORDS_DICT=strings([""])))
    assert outputs["BAD_WORDS_IDS"].tolist() == [[[0], [-1]]]
    assert outputs["STOP_WORDS_IDS"].tolist() == [[[END_OF_TEXT], [1]]]


def test_bad_words_embedding_bias_and_prompt_table(bundle, preprocess):
    outputs = preprocess(
        request(
            "Hi",
            BAD_WORDS_DICT=strings(["darn"]),
            EMBEDDING_BIAS_WORDS=strings(["Paris", "London"]),
            EMBEDDING_BIAS_WEIGHTS=np.array([[1.0, -2.0]], np.float32),
            PROMPT_TABLE_EXTRA_ID=np.array([[5]], np.uint64),
        )
    )
    check_contract(outputs, batch=1)
    assert outputs["BAD_WORDS_IDS"][0].tolist() == bundle.word_list(["darn"], "x").tolist()
    np.testing.assert_array_equal(outputs["EMBEDDING_BIAS"][0], bundle.embedding_bias(["Paris", "London"], [1.0, -2.0]))
    # Text never produces ids beyond the vocabulary, so no position is a prompt-table row.
    extra = outputs["OUT_PROMPT_TABLE_EXTRA_IDS"]
    assert extra.shape == outputs["INPUT_ID"].shape and not extra.any()


def test_decoder_query_is_encoded(bundle, preprocess):
    outputs = preprocess(request("Hi", DECODER_QUERY=strings(["Bonjour"])))
    expected = bundle.encode_text("Bonjour", add_special_tokens=True)
    assert outputs["DECODER_INPUT_ID"].tolist() == [expected]
    assert outputs["REQUEST_DECODER_INPUT_LEN"].tolist() == [[len(expected)]]


def test_special_token_modes(bundle):
    rendered = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    text_mode = Preprocessor(bundle)(request(rendered))["INPUT_ID"][0].tolist()
    assert [i for i in text_mode if i in bundle.special_ids] == [BOS]
    parse_mode = Preprocessor(bundle, query_special_tokens="parse")(request(rendered))["INPUT_ID"][0].tolist()
    assert parse_mode[:2] == [BOS, 128006] and parse_mode.count(BOS) == 1 and parse_mode[-1] == EOT
    without_bos = Preprocessor(bundle, add_special_tokens=False)(request("Hi"))["INPUT_ID"][0].tolist()
    assert without_bos == bundle.encode_text("Hi", add_special_tokens=False)
    with pytest.raises(ValueError):
        Preprocessor(bundle, query_special_tokens="yes")


@pytest.mark.parametrize(
    "inputs, field, problem",
    [
        (dict(query="Hi", messages=[{"role": "user", "content": "Hi"}]), "QUERY", "exactly one"),
        (dict(), "QUERY", "exactly one"),
        (dict(query=b"caf\xe9"), "QUERY", "not valid UTF-8"),
        (dict(query=""), "QUERY", "empty"),
        # BOS + 70 words + the trailing space: the error gives both numbers.
        (dict(query="word " * 70), "QUERY", "72 tokens, more than max_input_len 64"),
        (dict(query="Hi", output_len=0), "REQUEST_OUTPUT_LEN", "> 0"),
        (dict(query="Hi", output_len=-3), "REQUEST_OUTPUT_LEN", "> 0"),
        (dict(messages=[]), "MESSAGES", "no messages"),
        (dict(messages=[{"role": "wizard", "content": "Hi"}]), "MESSAGES", "'wizard'"),
        (dict(messages=[{"role": "user", "content": "x " * 80}]), "MESSAGES", "max_input_len 64"),
        (dict(query="Hi", END_ID=np.array([[128256]], np.int32)), "END_ID", "outside"),
        (dict(query="Hi", PAD_ID=np.array([[-1]], np.int32)), "PAD_ID", "outside"),
        (dict(query="Hi", STOP_WORDS_DICT=strings([b"\xff"])), "STOP_WORDS_DICT", "UTF-8"),
        (dict(query="Hi", EMBEDDING_BIAS_WORDS=strings(["a"])), "EMBEDDING_BIAS_WEIGHTS", "required"),
        (
            dict(
                query="Hi",
                EMBEDDING_BIAS_WORDS=strings(["a", "b"]),
                EMBEDDING_BIAS_WEIGHTS=np.array([[1.0]], np.float32),
            ),
            "EMBEDDING_BIAS_WEIGHTS",
            "1 weights for 2 words",
        ),
    ],
)
def test_invalid_requests_name_the_field(preprocess, inputs, field, problem):
    with pytest.raises(InvalidRequest) as caught:
        preprocess(request(**inputs))
    assert caught.value.field == field
    assert problem in caught.value.problem


def test_malformed_messages_json(preprocess):
    inputs = {"MESSAGES": strings(["[{"]), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)}
    with pytest.raises(InvalidRequest) as caught:
        preprocess(inputs)
    assert caught.value.field == "MESSAGES" and "not valid JSON" in caught.value.problem


def test_batch_errors_say_which_item(preprocess):
    inputs = {"QUERY": strings(["Hi"], [""]), "REQUEST_OUTPUT_LEN": np.array([[4], [4]], np.int32)}
    with pytest.raises(InvalidRequest) as caught:
        preprocess(inputs)
    assert caught.value.field == "QUERY" and caught.value.problem == "item 1: is empty"


def test_missing_output_len(preprocess):
    with pytest.raises(InvalidRequest) as caught:
        preprocess({"QUERY": strings(["Hi"])})
    assert caught.value.field == "REQUEST_OUTPUT_LEN"


def test_megabytes_of_text_are_refused_before_tokenizing(bundle):
    limited = Preprocessor(bundle, max_input_len=100)
    huge = "many words " * 200_000  # 2.2 MB: tokenizing it would take seconds
    for inputs, field in ((request(query=huge), "QUERY"),
                          (request(messages=[{"role": "user", "content": huge}]), "MESSAGES")):
        with pytest.raises(InvalidRequest) as error:
            limited(inputs)
        problem = error.value.problem
        assert error.value.field == field and "bytes" in problem and "max_input_len 100" in problem
