"""Guided decoding in the embedded engine: the tokenizer info file, the guide inputs, the grammar cache, and
generation under a grammar with a random-weight Llama-3-vocabulary model (the grammar, not the model, makes the
output valid)."""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from bls.errors import InvalidRequest
from bls.finish_reason import FinishReason
from embedded_engine.guided import GrammarCache, Guide, GuideDeadEnd, guided_decoding_file, parse_guide
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.scheduler import Engine, HFModelRunner
from embedded_engine.xgrammar_info import write_xgrammar_tokenizer_info
from testkit.schemas import validate_guided

VOCAB = 128256
EOT = 128009  # <|eot_id|>: the tokenizer's eos, so the info file's stop token
LIMITS = EngineLimits(VOCAB, max_seq_len=256, max_draft_len=4)
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def info_file(tokenizer_dir, tmp_path_factory):
    return write_xgrammar_tokenizer_info(tokenizer_dir, tmp_path_factory.mktemp("xgrammar") / "info.json")


@pytest.fixture(scope="module")
def grammars(info_file):
    return GrammarCache(info_file, VOCAB)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    engine = Engine(HFModelRunner(LlamaForCausalLM(config).eval()), LIMITS, max_active=8)
    yield engine
    engine.shutdown()


# ---- the tokenizer info file -------------------------------------------------------------------------------


def test_the_tokenizer_info_file_has_what_tensorrt_llms_generator_writes(info_file, tokenizer):
    text = info_file.read_text()
    info = json.loads(text)
    assert text == json.dumps(info)  # json.dump's defaults, as generate_xgrammar_tokenizer_info.py writes it
    assert list(info) == ["encoded_vocab", "tokenizer_str", "stop_token_ids"]
    vocab = tokenizer.get_vocab()
    assert len(info["encoded_vocab"]) == len(vocab) == VOCAB
    assert all(vocab[token] == index for index, token in enumerate(info["encoded_vocab"]))  # sorted by id
    assert info["tokenizer_str"] == tokenizer.backend_tokenizer.to_str()
    assert info["stop_token_ids"] == [tokenizer.eos_token_id] == [EOT]


# ---- the guide inputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("guide_type, guide, field, problem", [
    ("jsonn", "{}", "guided_decoding_guide_type", "'jsonn' is not a guide type"),
    ("js on", "{}", "guided_decoding_guide_type", "is not a guide type"),
    (None, "{}", "guided_decoding_guide", "needs guided_decoding_guide_type"),
    ("", "{}", "guided_decoding_guide", "needs guided_decoding_guide_type"),
    ("json_schema", None, "guided_decoding_guide", "is required with guided_decoding_guide_type 'json_schema'"),
    ("regex", None, "guided_decoding_guide", "is required"),
    ("ebnf_grammar", None, "guided_decoding_guide", "is required"),
])
def test_a_wrong_guide_is_refused_naming_the_input(guide_type, guide, field, problem):
    with pytest.raises(InvalidRequest) as error:
        parse_guide(guide_type, guide)
    assert error.value.field == field and problem in error.value.problem


def test_the_guide_types_of_tensorrt_llm_1_2_1():
    assert parse_guide(None, None) is None
    assert parse_guide("", "") is None  # a row of a batch without a guide
    assert parse_guide("json", None) == parse_guide("json", '{"type": "string"}') == Guide("json", None)  # ignored
    assert parse_guide("json_schema", "{}") == Guide("json_schema", "{}")
    assert parse_guide("regex", "a+") == Guide("regex", "a+")
    assert parse_guide("ebnf_grammar", 'root ::= "a"') == Guide("ebnf_grammar", 'root ::= "a"')


@pytest.mark.parametrize("backend, path", [(None, None), ("", "info.json"), ("xgrammar", ""),
                                           ("${guided_decoding_backend}", "info.json"),
                                           ("xgrammar", "${xgrammar_tokenizer_info_path}")])
def test_unset_parameters_leave_guided_decoding_off(backend, path, info_file):
    assert guided_decoding_file(backend, path, info_file.parent) is None


def test_the_parameters_name_the_file_relative_to_the_version_folder(info_file):
    assert guided_decoding_file("xgrammar", info_file.name, info_file.parent) == info_file
    with pytest.raises(ValueError, match="xgrammar_tokenizer_info_path: .*missing.json does not exist"):
        guided_decoding_file("xgrammar", "missing.json", info_file.parent)
    with pytest.raises(ValueError, match="guided_decoding_backend: 'outlines'"):
        guided_decoding_file("outlines", info_file.name, info_file.parent)


# ---- compiling -----------------------------------------------------------------------------------------------


def test_a_guide_is_compiled_once_however_often_it_is_sent(info_file):
    cache = GrammarCache(info_file, VOCAB)
    schema = json.dumps(PERSON)
    first = cache.compile(Guide("json_schema", schema))
    assert all(cache.compile(Guide("json_schema", schema)) is first for _ in range(1000))
    assert cache.compilations == 1


def test_the_cache_forgets_the_least_recently_used_guide(info_file):
    cache = GrammarCache(info_file, VOCAB, cache_size=2)
    a, b, c = (Guide("regex", f"{letter}+") for letter in "abc")
    cache.compile(a), cache.compile(b), cache.compile(a), cache.compile(c)  # b is the least recently used
    assert cache.compilations == 3
    cache.compile(a)
    assert cache.compilations == 3
    cache.compile(b)
    assert cache.compilations == 4


@pytest.mark.parametrize("guide, problem", [
    (Guide("json_schema", "{not json"), "Failed to parse JSON"),
    (Guide("json_schema", '{"type": "strin"}'), 'Unsupported type "strin"'),
    (Guide("regex", "(a"), "The parenthesis is not closed"),
    (Guide("ebnf_grammar", "root ::= rule"), 'Rule "rule" is not defined'),
])
def test_a_guide_that_does_not_compile_is_an_error_naming_the_guide(grammars, guide, problem):
    with pytest.raises(InvalidRequest) as error:
        grammars.compile(guide)
    assert error.value.field == "guided_decoding_guide"
    assert error.value.problem.startswith(f"does not compile as {guide.type}: ") and problem in error.value.problem
    assert not re.search(r"\[\d\d:\d\d:\d\d\]|\.cc:\d+", str(error.value))  # xgrammar's log prefix is dropped


def requests(grammars, prompt, output_len, guides, request_id="g", **extra):
    """One Triton request with a row per guide (None: unguided), parsed as the model parses it."""
    batch = len(guides)
    inputs = {
        "input_ids": np.array([prompt] * batch, np.int32),
        "input_lengths": np.array([len(prompt)] * batch, np.int32),
        "request_output_len": np.array([output_len] * batch, np.int32),
        "guided_decoding_guide_type": np.array([(g[0] if g else "").encode() for g in guides], object),
        "guided_decoding_guide": np.array([(g[1] or "").encode() if g else b"" for g in guides], object),
        **extra,
    }
    if all(g is None for g in guides):
        del inputs["guided_decoding_guide_type"], inputs["guided_decoding_guide"]
    return parse_generation_requests(inputs, request_id, LIMITS, True, 0, grammars)


def test_each_row_of_a_batch_gets_its_own_guide(grammars):
    rows = requests(grammars, [1, 2, 3], 8, [("regex", "a+"), None, ("json_schema", json.dumps(PERSON))])
    assert rows[1].guide is None
    assert [rows[0].guide.guide, rows[2].guide.guide] == \
        [Guide("regex", "a+"), Guide("json_schema", json.dumps(PERSON))]


def test_a_guided_request_to_an_engine_without_tokenizer_info_is_refused():
    with pytest.raises(InvalidRequest, match="guided_decoding_guide_type: guided decoding is not configured"):
        requests(None, [1, 2, 3], 8, [("json", None)])


def test_a_bad_guide_fails_the_request_before_it_is_queued(grammars):
    with pytest.raises(InvalidRequest, match="guided_decoding_guide: does not compile"):
        requests(grammars, [1, 2, 3], 8, [("regex", "a+"), ("regex", "(a")])


# ---- generating under a grammar ----------------------------------------------------------------------------


class Rows:
    """The events of every row of one submitted batch."""

    def __init__(self, count):
        self.tokens = [[] for _ in range(count)]
        self.events = [[] for _ in range(count)]
        self._left = count
        self._done = threading.Event()

    def __call__(self, event):
        row = event.request.batch_index
        self.events[row].append(event)
        self.tokens[row] += event.token_ids
        if event.finished:
            self._left -= 1
            if not self._left:
                self._done.set()

    def wait(self):
        assert self._done.wait(60)
        return self

    def final(self, row=0):
        return self.events[row][-1]


def generate(engine, rows):
    collected = Rows(len(rows))
    engine.submit_batch(rows, collected)
    return collected.wait()


SCHEMAS = [
    PERSON,
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"color": {"enum": ["red", "grün", "青"]}, "note": {"type": "string",
                                                                                     "maxLength": 3}},
     "required": ["color"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
     "required": ["code"]},
]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_random_model_writes_valid_documents_in_one_batch_of_different_guides(engine, grammars, tokenizer,
                                                                                temperature):
    guides = [("json_schema", json.dumps(s)) for s in SCHEMAS] + [("regex", r"[0-9]{3}-[a-z]{2}"),
                                                                  ("ebnf_grammar", 'root ::= "yes" | "no"')]
    rows = requests(grammars, [128000, 9906], 64, guides, end_id=np.array([EOT], np.int32),
                    temperature=np.array([temperature], np.float32), runtime_top_k=np.array([0], np.int32),
                    runtime_top_p=np.array([1.0], np.float32), seed=np.array([3], np.uint64))
    result = generate(engine, rows)
    texts = [tokenizer.decode(tokens) for tokens in result.tokens]
    for row, schema in enumerate(SCHEMAS):
        assert result.final(row).finish_reason is FinishReason.END_ID, texts[row]
        validate_guided(json.loads(texts[row]), schema)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", texts[-2]) and texts[-1] in ("yes", "no")
    assert all(EOT not in tokens for tokens in result.tokens)  # the guide's stop token ends it, as end_id


def test_max_tokens_cuts_the_document_short_with_length_never_a_fake_document(engine, grammars, tokenizer):
    result = generate(engine, requests(grammars, [128000, 9906], 5, [("json_schema", json.dumps(PERSON))],
                                       end_id=np.array([EOT], np.int32)))
    assert result.final().finish_reason is FinishReason.LENGTH and len(result.tokens[0]) == 5
    with pytest.raises(ValueError):
        json.loads(tokenizer.decode(result.tokens[0]))


@pytest.mark.parametrize("end_id", [None, -1, 128001])
def test_the_document_ends_on_the_guides_stop_token_whatever_end_id_says(engine, grammars, tokenizer, end_id):
    extra = {} if end_id is None else {"end_id": np.array([end_id], np.int32)}
    result = generate(engine, requests(grammars, [128000, 9906], 64, [("json_schema", json.dumps(PERSON))], **extra))
    assert result.final().finish_reason is FinishReason.END_ID
    validate_guided(json.loads(tokenizer.decode(result.tokens[0])), PERSON)


def test_a_stop_word_inside_the_document_ends_it_there(engine, grammars, tokenizer):
    unstopped = generate(engine, requests(grammars, [128000], 64, [("json_schema", json.dumps(PERSON))]))
    stop = unstopped.tokens[0][2]
    stop_words = np.array([[[stop], [1]]], np.int32)
    result = generate(engine, requests(grammars, [128000], 64, [("json_schema", json.dumps(PERSON))],
                                       stop_words_list=stop_words))
    assert result.final().finish_reason is FinishReason.STOP_WORDS
    assert result.tokens[0] == unstopped.tokens[0][:3]


def test_min_tokens_never_keeps_a_complete_document_from_ending(engine, grammars, tokenizer):
    result = generate(engine, requests(grammars, [128000], 64, [("ebnf_grammar", 'root ::= "yes" | "no"')],
                                       min_tokens=np.array([20], np.int32)))
    assert result.final().finish_reason is FinishReason.END_ID
    assert tokenizer.decode(result.tokens[0]) in ("yes", "no")


def test_bad_words_that_leave_the_guide_no_token_fail_that_sequence_alone(engine, grammars, tokenizer):
    digits = [id_ for token, id_ in tokenizer.get_vocab().items() if re.fullmatch("[0-9]+", token)]  # "7", "2024"
    bad_words = np.array([[digits, list(range(1, len(digits) + 1))]], np.int32)
    result = generate(engine, requests(grammars, [128000], 8, [("regex", "[0-9]+")], bad_words_list=bad_words))
    error = result.final().error
    assert isinstance(error, GuideDeadEnd) and error.field == "guided_decoding_guide" and "bad_words_list" in str(error)
    assert not result.tokens[0]
    after = generate(engine, requests(grammars, [128000], 8, [("regex", "[0-9]{2}")]))  # the engine goes on
    assert re.fullmatch("[0-9]{2}", tokenizer.decode(after.tokens[0]))


def test_draft_tokens_that_break_the_grammar_are_rejected_and_greedy_output_is_unchanged(engine, grammars,
                                                                                         tokenizer):
    guide = [("regex", "[0-9]{12}")]
    expected = generate(engine, requests(grammars, [128000, 9906], 32, guide)).tokens[0]
    assert re.fullmatch("[0-9]{12}", tokenizer.decode(expected))
    letter = tokenizer.convert_tokens_to_ids("a")  # never allowed by the grammar
    for draft, accepted in ((expected[:4], 4), (expected[:2] + [letter, expected[3]], 2), ([letter], 0)):
        result = generate(engine, requests(grammars, [128000, 9906], 32, guide,
                                           draft_input_ids=np.array([draft], np.int32)))
        first = result.events[0][0]
        assert first.accepted_draft_tokens == accepted and first.token_ids == expected[:accepted + 1]
        assert result.tokens[0] == expected


def test_numeric_bounds_are_checked_only_where_xgrammar_enforces_them():
    from testkit.schemas import enforced_schema

    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "items": [{"exclusiveMaximum": 3, "maxLength": 2}]}
    assert enforced_schema(schema, "0.2.8") == schema
    assert enforced_schema(schema, "0.1.32") == {"type": "object", "properties": {"age": {"type": "integer"}},
                                                 "items": [{"maxLength": 2}]}
    assert schema["properties"]["age"]["maximum"] == 120  # the guide itself is untouched
