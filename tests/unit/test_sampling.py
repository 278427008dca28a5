import numpy as np
import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from bls.word_lists import WordList
from embedded_engine.sampling import SamplingParams, TokenSampler

VOCAB = 32


def words(*word_tuples):
    return WordList(tuple(tuple(w) for w in word_tuples))


def sampler(params=SamplingParams(), prompt=(1, 2), end_id=None, stop_words=WordList(), log_probs=True):
    return TokenSampler(params, VOCAB, prompt, end_id, stop_words, want_log_probs=log_probs)


def ramp():
    """Logits increasing with the token id: greedy picks VOCAB-1, then VOCAB-2 if that one is banned..."""
    return torch.arange(VOCAB, dtype=torch.float32) / 4


@pytest.mark.parametrize(
    "params",
    [SamplingParams(), SamplingParams(temperature=0.0, top_k=50, top_p=0.9), SamplingParams(top_k=1, temperature=2)],
)
def test_greedy_cases_pick_the_argmax(params):
    assert params.greedy
    assert sampler(params).choose(ramp(), [1, 2]).token_id == VOCAB - 1


def test_log_prob_is_log_softmax_of_the_processed_logits_and_input_is_untouched():
    logits = ramp()
    before = logits.clone()
    chosen = sampler().choose(logits, [1, 2])
    assert chosen.log_prob == pytest.approx(float(torch.log_softmax(before, 0)[VOCAB - 1]), abs=1e-6)
    assert torch.equal(logits, before)
    assert sampler(log_probs=False).choose(ramp(), [1]).log_prob is None


def test_embedding_bias_is_added_first():
    bias = np.zeros(VOCAB, np.float32)
    bias[3] = 100.0
    chosen = sampler(SamplingParams(embedding_bias=bias)).choose(ramp(), [1, 2])
    assert chosen.token_id == 3


def test_bad_words_ban_single_tokens_and_the_last_token_of_matching_sequences():
    params = SamplingParams(bad_words=words([VOCAB - 1], [7, VOCAB - 2]))
    assert sampler(params).choose(ramp(), [1, 2]).token_id == VOCAB - 2  # [7, 30] does not apply after 2
    assert sampler(params).choose(ramp(), [1, 7]).token_id == VOCAB - 3  # ... but does after 7


def test_min_tokens_bans_end_id_and_stop_word_completions_until_reached():
    end_id, stop = VOCAB - 1, words([VOCAB - 2])
    token_sampler = sampler(SamplingParams(min_tokens=2), end_id=end_id, stop_words=stop)
    tokens = [1, 2]
    first = token_sampler.choose(ramp(), tokens).token_id
    tokens.append(first)
    second = token_sampler.choose(ramp(), tokens).token_id
    tokens.append(second)
    third = token_sampler.choose(ramp(), tokens).token_id
    assert (first, second, third) == (VOCAB - 3, VOCAB - 3, VOCAB - 1)


def test_repetition_penalty_matches_transformers_over_prompt_and_output():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1)) * 3
    prompt, output = [4, 5, 6], [7, 4]
    token_sampler = sampler(SamplingParams(repetition_penalty=1.7), prompt=prompt, log_probs=True)
    for token in output:  # generate the output through the sampler, which records it as the engine's steps do
        forced = torch.full((VOCAB,), -100.0)
        forced[token] = 100.0
        assert token_sampler.choose(forced, prompt).token_id == token
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + output]), logits[None].clone())[0]
    chosen = token_sampler.choose(logits, prompt + output)
    assert chosen.token_id == int(torch.argmax(expected))
    assert chosen.log_prob == pytest.approx(float(torch.log_softmax(expected, 0).max()), abs=1e-5)


def test_presence_and_frequency_penalties_count_output_tokens_only():
    logits = torch.zeros(VOCAB)
    logits[10], logits[11] = 5.0, 4.6
    params = SamplingParams(presence_penalty=0.2, frequency_penalty=0.3)
    token_sampler = sampler(params, prompt=(10, 10, 10))  # the prompt does not count
    tokens = [10, 10, 10]
    chosen = []
    for _ in range(4):
        token = token_sampler.choose(logits, tokens)
        tokens.append(token.token_id)
        chosen.append(token)
    # 10: 5.0 -> 4.5 after one use, 11: 4.6 -> 4.1 after one use, 10 twice: 5.0 - 0.6 - 0.2 = 4.2 > 4.1
    assert [t.token_id for t in chosen] == [10, 11, 10, 10]
    expected = logits.clone()
    expected[10], expected[11] = 5.0 - 0.6 - 0.2, 4.6 - 0.3 - 0.2
    assert chosen[-1].log_prob == pytest.approx(float(torch.log_softmax(expected, 0)[10]), abs=1e-5)


def test_top_k_sampling_stays_within_the_k_best_and_is_seeded():
    params = SamplingParams(temperature=5.0, top_k=3, seed=42)
    logits = ramp()
    draws = [sampler(params).choose(logits, [1]).token_id for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, fresh sampler: same first draw
    token_sampler = sampler(params)
    seen = {token_sampler.choose(logits, [1]).token_id for _ in range(200)}
    assert seen == {VOCAB - 1, VOCAB - 2, VOCAB - 3}


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.full((VOCAB,), -20.0)
    logits[[3, 4, 5]] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    token_sampler = sampler(SamplingParams(top_p=0.7, seed=3))
    seen = {token_sampler.choose(logits, [1]).token_id for _ in range(200)}
    assert seen == {3, 4}  # 0.5 < 0.7, 0.5 + 0.3 crosses it: token 5 is never drawn


def test_different_seeds_draw_differently():
    params = [SamplingParams(temperature=1.0, top_p=1.0, seed=seed) for seed in range(6)]
    flat = torch.zeros(VOCAB)
    firsts = {sampler(p).choose(flat, [1]).token_id for p in params}
    assert len(firsts) > 1


def test_top_p_nucleus_larger_than_the_first_candidates():
    vocab = 1000
    logits = torch.zeros(vocab)
    logits[:500] = 0.01  # half of the mass spread over 500 tokens, more than the first 64 candidates
    params = SamplingParams(top_p=0.4, seed=5)
    token_sampler = TokenSampler(params, vocab, [1], None, WordList(), want_log_probs=False)
    seen = {token_sampler.choose(logits, [1]).token_id for _ in range(300)}
    assert len(seen) > TokenSampler.NUCLEUS_FIRST_CANDIDATES
    assert max(seen) < 500
