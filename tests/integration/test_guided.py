"""Guided decoding (structured output) through every path of a real tritonserver: ensemble, tensorrt_llm_bls and
tensorrt_llm, streamed and not, at temperature 0 and 1, a batch of different guides per request.

The default model has random weights: the grammar, not the model, makes every document valid. Each request holds
every guide of GUIDES as one batch (so one server and a few requests cover the dozen schemas, the regexes and the
grammars), with max_tokens large enough for each guide's documents.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from testkit.grpc import grpc_stream
from testkit.http import HttpError, generate, generate_stream
from testkit.schemas import validate_guided

TEXT_MODELS = ("ensemble", "tensorrt_llm_bls")
EOT = 128009

SCHEMAS = [
    # required fields, a bounded string, an integer with bounds
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    # nested objects and an array
    {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}, "required": ["b"]}},
     "required": ["a"]},
    # an enum with unicode values, an optional field
    {"type": "object", "properties": {"city": {"enum": ["Zürich", "東京", "São Paulo"]},
                                      "note": {"type": "string", "maxLength": 3}}, "required": ["city"]},
    # an array of bounded integers
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 3},
    # a number with bounds
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 100}},
     "required": ["price"]},
    # a string with a pattern
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"}},
     "required": ["code"]},
    # optional fields only, a null
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}},
     "additionalProperties": False},
    # an array of objects
    {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}},
                                "required": ["id"]}, "minItems": 1, "maxItems": 2},
    # anyOf
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]},
    # integers as an enum, a boolean
    {"type": "object", "properties": {"level": {"enum": [1, 2, 3]}, "urgent": {"type": "boolean"}},
     "required": ["level", "urgent"]},
    # a unicode constant and a short unicode-capable string
    {"type": "object", "properties": {"greeting": {"const": "こんにちは 🙂"},
                                      "reply": {"type": "string", "minLength": 1, "maxLength": 2}},
     "required": ["greeting", "reply"]},
    # an OpenAI tool's parameters (what the frontend's tool choice sends)
    {"type": "object", "properties": {"location": {"type": "string", "maxLength": 10},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
     "required": ["location", "unit"]},
]
REGEXES = [r"[0-9]{3}-[a-z]{2}", r"(yes|no|maybe)", r"[A-Z][a-z]{1,5}@example\.com"]
GRAMMARS = [
    ('root ::= "yes" | "no"', re.compile(r"yes|no")),
    ('root ::= digit digit "-" digit\ndigit ::= [0-9]', re.compile(r"[0-9]{2}-[0-9]")),
    ('root ::= "(" expr ")"\nexpr ::= [0-9] | "(" [0-9] ")"', re.compile(r"\(([0-9]|\([0-9]\))\)")),
]
GUIDES = ([("json_schema", json.dumps(s)) for s in SCHEMAS] + [("regex", r) for r in REGEXES]
          + [("ebnf_grammar", g) for g, _ in GRAMMARS])
# Guides whose documents are ASCII whatever the model writes (no free string): the ensemble streams each token's
# text decoded alone, as upstream's postprocessing does, so a character split across tokens arrives as U+FFFD pieces.
ASCII_GUIDES = [guide for index, guide in enumerate(GUIDES) if index not in (0, 2, 10, 11)]
MAX_TOKENS = 48  # enough for every guide above (the longest document takes about 25 tokens)


def check_document(guide: tuple[str, str], text: str) -> None:
    kind, source = guide
    if kind == "json_schema":
        validate_guided(json.loads(text), json.loads(source))
    elif kind == "regex":
        assert re.fullmatch(source, text), (source, text)
    else:
        pattern = dict(GRAMMARS)[source]
        assert pattern.fullmatch(text), (source, text)


def batch_inputs(prompts: list[str], guides, max_tokens: int, temperature: float, stream: bool) -> dict:
    rows = len(prompts)
    return {
        "text_input": np.array([[p.encode()] for p in prompts], object),
        "max_tokens": np.full((rows, 1), max_tokens, np.int32),
        "temperature": np.full((rows, 1), temperature, np.float32),
        "top_k": np.zeros((rows, 1), np.int32),
        "top_p": np.ones((rows, 1), np.float32),
        "seed": np.full((rows, 1), 7, np.uint64),
        "stream": np.full((rows, 1), stream),
        "guided_decoding_guide_type": np.array([[kind.encode()] for kind, _ in guides], object),
        "guided_decoding_guide": np.array([[guide.encode()] for _, guide in guides], object),
    }


def texts_by_row(result, rows: int) -> list[str]:
    """Each row's whole text from the responses of one request: a row's pieces, each response naming its row
    (batch_index), or one response holding every row's text."""
    pieces: list[list[bytes]] = [[] for _ in range(rows)]
    for response in result.responses:
        if "text_output" not in response:
            continue
        texts = response["text_output"].reshape(-1)
        if "batch_index" in response:
            pieces[int(response["batch_index"].reshape(-1)[0])].append(texts[0])
        else:
            assert len(texts) == rows
            for row, text in enumerate(texts):
                pieces[row].append(text)
    return [b"".join(p).decode() for p in pieces]


@pytest.mark.parametrize("model, temperature, stream, guides", [
    ("ensemble", 0.0, False, GUIDES), ("ensemble", 1.0, True, ASCII_GUIDES), ("tensorrt_llm_bls", 0.0, True, GUIDES),
    ("tensorrt_llm_bls", 1.0, False, GUIDES),
])
def test_every_guide_of_a_batch_gives_a_valid_document(endpoint, model, temperature, stream, guides):
    prompts = [f"Request {i}: answer in the required format." for i in range(len(guides))]
    result = grpc_stream(endpoint.grpc, model, batch_inputs(prompts, guides, MAX_TOKENS, temperature, stream),
                         ["text_output", "batch_index"], timeout=300)
    assert result.error is None and result.completed
    for guide, text in zip(guides, texts_by_row(result, len(guides)), strict=True):
        check_document(guide, text)


def test_the_engine_itself_follows_each_rows_guide(endpoint, bundle):
    """tensorrt_llm with token ids, as NVIDIA's token-level clients call it: a batch of three different guides."""
    guides = [GUIDES[0], ("regex", REGEXES[0]), ("ebnf_grammar", GRAMMARS[1][0])]
    prompts = [bundle.encode_text(f"Row {i}", add_special_tokens=True) for i in range(len(guides))]
    width = max(map(len, prompts))
    inputs = {
        "input_ids": np.array([p + [0] * (width - len(p)) for p in prompts], np.int32),
        "input_lengths": np.array([[len(p)] for p in prompts], np.int32),
        "request_output_len": np.full((3, 1), MAX_TOKENS, np.int32),
        "end_id": np.full((3, 1), EOT, np.int32),
        "exclude_input_in_output": np.full((3, 1), True),
        "guided_decoding_guide_type": np.array([[k.encode()] for k, _ in guides], object),
        "guided_decoding_guide": np.array([[g.encode()] for _, g in guides], object),
    }
    result = grpc_stream(endpoint.grpc, "tensorrt_llm", inputs, ["output_ids", "sequence_length", "batch_index"])
    assert result.error is None and result.completed and len(result.responses) == 3
    for response in result.responses:
        row = int(response["batch_index"].reshape(-1)[0])
        ids = response["output_ids"].reshape(-1)[: int(response["sequence_length"].reshape(-1)[0])].tolist()
        assert EOT not in ids  # the guide's stop token ends the sequence as end_id: not part of the output
        check_document(guides[row], bundle.decode(ids, skip_special_tokens=True))


def test_draft_tokens_that_break_the_grammar_do_not_change_greedy_output(endpoint, bundle):
    if int(endpoint.model_parameter("tensorrt_llm", "max_draft_len") or 0) < 3:
        pytest.skip("the target engine takes no draft tokens")
    prompt = bundle.encode_text("Digits:", add_special_tokens=True)

    def run(draft: list[int] | None) -> list[int]:
        inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([[len(prompt)]], np.int32),
                  "request_output_len": np.array([[16]], np.int32), "end_id": np.array([[EOT]], np.int32),
                  "exclude_input_in_output": np.array([[True]]),
                  "guided_decoding_guide_type": np.array([[b"regex"]], object),
                  "guided_decoding_guide": np.array([[b"[0-9]{10}"]], object)}
        if draft is not None:
            inputs["draft_input_ids"] = np.array([draft], np.int32)
        result = grpc_stream(endpoint.grpc, "tensorrt_llm", inputs, ["output_ids", "sequence_length"])
        assert result.error is None and result.completed
        return [int(t) for r in result.responses
                for t in r["output_ids"].reshape(-1)[: int(r["sequence_length"].reshape(-1)[0])]]

    expected = run(None)
    assert re.fullmatch("[0-9]{10}", bundle.decode(expected, skip_special_tokens=True))
    letter = bundle.encode_text("a", add_special_tokens=False)[0]  # never allowed by the guide
    assert run([expected[0], letter, expected[2]]) == expected


def test_max_tokens_cuts_a_document_short_with_length(endpoint):
    body = {"text_input": "JSON:", "max_tokens": 4, "guided_decoding_guide_type": "json_schema",
            "guided_decoding_guide": json.dumps(SCHEMAS[0])}
    result = generate(endpoint.http, "tensorrt_llm_bls", body)
    assert result["finish_reason"] == "length" and result["num_output_tokens"] == 4
    for text in (result["text_output"], generate(endpoint.http, "ensemble", body)["text_output"]):
        assert text.startswith("{") and not is_json(text)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("end_id", [-1, EOT])
def test_stop_words_and_end_id_with_a_guide(endpoint, end_id):
    body = {"text_input": "JSON:", "max_tokens": MAX_TOKENS, "guided_decoding_guide_type": "json_schema",
            "guided_decoding_guide": json.dumps(SCHEMAS[0]), "end_id": end_id}
    whole = generate(endpoint.http, "tensorrt_llm_bls", body)
    assert whole["finish_reason"] == "stop"  # -1: no end id, yet the document ends on the guide's stop token
    check_document(GUIDES[0], whole["text_output"])
    cut = generate(endpoint.http, "tensorrt_llm_bls", {**body, "stop_words": '"age'})
    assert cut["finish_reason"] == "stop" and cut["text_output"].endswith('"age')
    assert whole["text_output"].startswith(cut["text_output"])


def test_the_guide_in_a_generate_request_is_a_json_string(endpoint):
    """Triton's generate endpoint maps a JSON string to a TYPE_STRING input; a JSON object never reaches a model:
    under an input's name Triton itself answers 500 "Unable to parse JSON bytes array" (under a name that is no
    input, 400: request parameters are int, bool or string). So a schema is sent as a string, json.dumps(schema)."""
    body = {"text_input": "JSON:", "max_tokens": MAX_TOKENS, "guided_decoding_guide_type": "json_schema"}
    for model in TEXT_MODELS:
        ok = generate(endpoint.http, model, {**body, "guided_decoding_guide": json.dumps(SCHEMAS[0])})
        check_document(GUIDES[0], ok["text_output"])
        streamed = generate_stream(endpoint.http, model, {**body, "stream": True,
                                                          "guided_decoding_guide": json.dumps(SCHEMAS[0])})
        check_document(GUIDES[0], "".join(event.get("text_output", "") for event in streamed))
        with pytest.raises(HttpError) as error:
            generate(endpoint.http, model, {**body, "guided_decoding_guide": SCHEMAS[0]})
        assert error.value.status == 500 and "JSON non-string as string" in error.value.message


@pytest.mark.parametrize("model", TEXT_MODELS)
@pytest.mark.parametrize("fields, field, problem", [
    ({"guided_decoding_guide_type": "jsonn", "guided_decoding_guide": "{}"}, "guided_decoding_guide_type",
     "'jsonn' is not a guide type"),
    ({"guided_decoding_guide_type": "json_schema"}, "guided_decoding_guide", "is required"),
    ({"guided_decoding_guide_type": "json_schema", "guided_decoding_guide": '{"type": "strin"}'},
     "guided_decoding_guide", "does not compile as json_schema"),
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "(a"}, "guided_decoding_guide",
     "does not compile as regex"),
])
def test_a_bad_guide_is_an_error_naming_the_field_and_the_server_goes_on(endpoint, model, fields, field, problem):
    if endpoint.model_config("tensorrt_llm").get("backend") != "python":
        pytest.skip("the embedded engine's messages")
    for send in (generate, lambda url, m, body: generate_stream(url, m, {**body, "stream": True})):
        with pytest.raises(HttpError) as error:
            send(endpoint.http, model, {"text_input": "Hi", "max_tokens": 4, **fields})
        assert f"{field}: " in error.value.message and problem in error.value.message
        assert "Traceback" not in error.value.message
    ok = generate(endpoint.http, model, {"text_input": "Hi", "max_tokens": 8, "guided_decoding_guide_type": "regex",
                                         "guided_decoding_guide": "[a-z]{3}"})
    assert re.fullmatch("[a-z]{3}", ok["text_output"])


def test_speculative_decoding_with_a_guide_is_refused_by_name(endpoint):
    if not endpoint.has_model("tensorrt_llm_draft"):
        pytest.skip("no draft model")
    with pytest.raises(HttpError) as error:
        generate(endpoint.http, "tensorrt_llm_bls", {"text_input": "Hi", "max_tokens": 8, "num_draft_tokens": 3,
                                                     "guided_decoding_guide_type": "json"})
    assert "num_draft_tokens: " in error.value.message and "guided decoding" in error.value.message
