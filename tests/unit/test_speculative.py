import threading

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bls.finish_reason import FinishReason
from bls.word_lists import WordList
from embedded_engine.draft_verification import accept_tokens
from embedded_engine.request import EngineLimits, parse_generation_requests
from embedded_engine.sampling import SamplingParams, TokenSampler
from embedded_engine.scheduler import Engine, HFModelRunner
from embedded_engine.stopping import StopCriteria

VOCAB = 50
PROMPT = [1, 2, 3]


def target_logits(choices):
    """Rows whose argmax is the target's choice at each position."""
    logits = torch.zeros(len(choices), VOCAB)
    logits[torch.arange(len(choices)), torch.tensor(choices)] = 10.0
    return logits


def verify(choices, draft, end_id=None, stop_words=WordList(), max_new_tokens=10):
    tokens = list(PROMPT)
    sampler = TokenSampler(SamplingParams(), VOCAB, PROMPT, end_id, stop_words, want_log_probs=True)
    step = accept_tokens(
        target_logits(choices), draft, sampler, tokens, len(PROMPT), StopCriteria(end_id, stop_words, max_new_tokens)
    )
    assert tokens == PROMPT + step.token_ids  # appended in place
    return step


def test_accepts_the_agreeing_prefix_plus_the_targets_own_token():
    step = verify(choices=[7, 8, 9, 10], draft=[7, 8, 30])
    assert step.token_ids == [7, 8, 9]
    assert step.accepted_drafts == 2
    assert step.rows == [0, 1, 2]
    assert len(step.log_probs) == 3
    assert step.finish_reason is None


def test_all_drafts_accepted_gives_a_bonus_token():
    step = verify(choices=[7, 8, 9, 10], draft=[7, 8, 9])
    assert (step.token_ids, step.accepted_drafts) == ([7, 8, 9, 10], 3)


def test_first_draft_rejected_still_yields_one_token():
    step = verify(choices=[7, 8], draft=[20])
    assert (step.token_ids, step.accepted_drafts) == ([7], 0)


def test_plain_decode_is_a_step_without_drafts():
    step = verify(choices=[7], draft=[])
    assert (step.token_ids, step.accepted_drafts) == ([7], 0)


def test_end_id_inside_the_accepted_run_truncates_without_the_end_token():
    step = verify(choices=[7, 2, 9, 10], draft=[7, 2, 9], end_id=2)
    assert (step.token_ids, step.finish_reason) == ([7], FinishReason.END_ID)


def test_stop_word_inside_the_run_truncates_after_the_stop_word():
    step = verify(choices=[7, 8, 9, 10], draft=[7, 8, 9], stop_words=WordList(((7, 8),)))
    assert (step.token_ids, step.finish_reason, step.accepted_drafts) == ([7, 8], FinishReason.STOP_WORDS, 2)


def test_token_limit_inside_the_run_truncates():
    step = verify(choices=[7, 8, 9, 10], draft=[7, 8, 9], max_new_tokens=2)
    assert (step.token_ids, step.finish_reason) == ([7, 8], FinishReason.LENGTH)


# ---- through the engine with a real (small, random) Llama ------------------------------------------


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def engine(model):
    engine = Engine(HFModelRunner(model), EngineLimits(256, 128, max_draft_len=4), max_active=4)
    yield engine
    engine.shutdown()


def greedy(model, prompt, n):
    output = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return output[0, len(prompt) :].tolist()


def run(engine, prompt, output_len, draft):
    inputs = {
        "input_ids": np.array([prompt], np.int32),
        "input_lengths": np.array([len(prompt)], np.int32),
        "request_output_len": np.array([output_len], np.int32),
        "draft_input_ids": np.array([draft], np.int32),
    }
    (request,) = parse_generation_requests(inputs, "spec", engine.limits, True)
    events, done = [], threading.Event()

    def on_event(event):
        events.append(event)
        if event.finished:
            done.set()

    engine.submit(request, on_event)
    assert done.wait(30)
    return events


PROMPT_IDS = [5, 17, 42, 99, 3, 250]


def test_verification_keeps_greedy_output_and_the_cache_consistent(model, engine):
    expected = greedy(model, PROMPT_IDS, 10)
    wrong = (expected[2] + 1) % 256
    events = run(engine, PROMPT_IDS, 10, draft=[expected[0], expected[1], wrong])
    assert events[0].token_ids == expected[:3]  # two drafts accepted + the target's own token in one step
    assert events[0].accepted_draft_tokens == 2
    # Decoding goes on after the rejected draft: the cache was cropped to the accepted tokens.
    assert [t for e in events for t in e.token_ids] == expected
    assert events[-1].finish_reason == FinishReason.LENGTH


def test_fully_accepted_draft_finishes_in_one_step_like_the_bls_target_call(model, engine):
    expected = greedy(model, PROMPT_IDS, 5)
    events = run(engine, PROMPT_IDS, 5, draft=expected[:4])  # request_output_len = len(draft) + 1
    assert len(events) == 1
    assert events[0].token_ids == expected
    assert events[0].accepted_draft_tokens == 4
    assert events[0].finished and events[0].finish_reason == FinishReason.LENGTH
