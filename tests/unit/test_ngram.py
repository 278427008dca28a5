"""N-gram drafting (embedded_engine.ngram): what it proposes, and that greedy output equals no speculation."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from embedded_engine.ngram import NGramDrafting
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.scheduler import Engine, HFModelRunner
from tests.unit.test_scheduler import Collector

VOCAB = 64
LIMITS = EngineLimits(VOCAB, max_seq_len=256)


def test_it_proposes_what_followed_the_longest_matching_suffix():
    drafting = NGramDrafting(max_draft_len=3, max_matching_ngram_size=2)
    assert drafting.propose([1, 2, 3, 4, 5, 1, 2], limit=5) == [3, 4, 5]
    assert drafting.propose([1, 2, 3, 1, 2, 9, 1, 2], limit=5) == [3, 1, 2]  # the oldest match
    assert NGramDrafting(3, 2, is_use_oldest=False).propose([1, 2, 3, 1, 2, 9, 1, 2], limit=5) == [9, 1, 2]
    assert drafting.propose([4, 2, 9, 3, 2], limit=5) == [9, 3, 2]  # no 2-gram match: the 1-gram [2]
    assert drafting.propose([1, 2, 3, 1, 2], limit=1) == [3]
    assert drafting.propose([7, 8, 9], limit=5) == []
    assert drafting.propose([1, 2, 1, 2], limit=0) == []


@pytest.mark.parametrize("field", ["max_draft_len", "max_matching_ngram_size"])
def test_both_sizes_must_be_positive(field):
    with pytest.raises(ValueError, match=field):
        NGramDrafting(**{"max_draft_len": 2, "max_matching_ngram_size": 2, field: 0})


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config).eval()


def generate(model, prompt, output_len, ngram, **extra):
    engine = Engine(HFModelRunner(model), LIMITS, max_active=4, ngram=ngram)
    try:
        inputs = {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
                  "request_output_len": np.array([output_len], np.int32), **extra}
        (request,) = parse_generation_requests(inputs, "r", LIMITS, True)
        collector = Collector()
        engine.submit(request, collector)
        return collector.wait()
    finally:
        engine.shutdown()


# A prompt that repeats itself, so that the greedy output (a tiny random model's loops) matches n-grams of it.
PROMPTS = ([3, 9, 27, 5, 3, 9, 27, 5, 3, 9], list(range(10, 40)) * 2, [1, 2])


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("sizes", [(1, 1), (4, 2), (8, 3)])
def test_greedy_output_equals_no_speculation(model, prompt, sizes):
    plain = generate(model, prompt, 40, None)
    drafted = generate(model, prompt, 40, NGramDrafting(*sizes))
    assert drafted.tokens == plain.tokens
    assert drafted.events[-1].finish_reason == plain.events[-1].finish_reason
    assert sum(e.drafted_tokens for e in plain.events) == 0


def test_drafts_are_accepted_and_take_fewer_steps_on_input_grounded_output(model):
    prompt = list(range(10, 40)) * 2
    plain = generate(model, prompt, 48, None)
    drafted = generate(model, prompt, 48, NGramDrafting(8, 3))
    accepted = sum(e.accepted_draft_tokens for e in drafted.events)
    assert accepted > 0 and sum(e.drafted_tokens for e in drafted.events) >= accepted
    assert len([e for e in drafted.events if e.token_ids]) < len([e for e in plain.events if e.token_ids])


def test_drafting_never_passes_the_token_limit_nor_a_stop_word(model):
    prompt = list(range(10, 40)) * 2
    plain = generate(model, prompt, 7, None)
    drafted = generate(model, prompt, 7, NGramDrafting(8, 3))
    assert drafted.tokens == plain.tokens and len(drafted.tokens) == 7
    stop = plain.tokens[2:4]
    words = np.array([[[*stop], [2, -1]]], np.int32)
    plain = generate(model, prompt, 40, None, stop_words_list=words)
    drafted = generate(model, prompt, 40, NGramDrafting(8, 3), stop_words_list=words)
    assert drafted.tokens == plain.tokens and drafted.tokens[-2:] == stop


def test_sampled_output_with_drafts_is_reproducible(model):
    prompt = list(range(10, 40)) * 2
    extra = {"temperature": np.array([0.7], np.float32), "runtime_top_k": np.array([5], np.int32),
             "seed": np.array([3], np.uint64)}
    first = generate(model, prompt, 30, NGramDrafting(4, 2), **extra)
    second = generate(model, prompt, 30, NGramDrafting(4, 2), **extra)
    assert first.tokens == second.tokens and len(first.tokens) == 30
