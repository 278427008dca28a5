"""The BLS's draft-target loop, against a deterministic in-process stand-in for the two engines.

The stand-in follows TensorRT-LLM's draft_tokens_external contract as far as the BLS can see it: the
target returns its own greedy tokens up to request_output_len, stops at end_id and never returns it (how
many draft tokens it accepted is the BLS's own count); the real engines are exercised by the integration
tests.
"""

import numpy as np
import pytest

from bls.generation.draft_target import DraftTargetDecoder
from bls.word_lists import WordList

END_ID = 2


def target_next(sequence):
    """The target's greedy choice: a fixed function of the last two tokens."""
    return (sequence[-1] * 7 + sequence[-2] * 3) % 50 + 3


class FakeEngines:
    def __init__(self, draft_error_every=5, end_after=None, fill=True):
        self.draft_error_every = draft_error_every
        self.end_after = end_after  # emit end_id once the sequence is this long
        self.fill = fill  # the target goes on to request_output_len (True) or returns after verifying
        self.calls = []

    def _next(self, seq):
        if self.end_after is not None and len(seq) >= self.end_after:
            return END_ID
        return target_next(seq)

    def stream_each(self, model_name, inputs, outputs, request_id, on_response):
        """As bls.relay.engine_streams.RelayedEngineStreams: each response to on_response on the caller's thread."""
        for response in self.stream(model_name, inputs, outputs, request_id):
            if not on_response(response):
                return False
        return True

    def stream(self, model_name, inputs, outputs, request_id=""):
        seq = inputs["input_ids"].reshape(-1).tolist()
        n = int(inputs["request_output_len"].reshape(-1)[0])
        self.calls.append((model_name, len(seq), n))
        out = []
        if model_name == "draft":
            for i in range(n):
                token = self._next(seq + out)
                if (len(seq) + i) % self.draft_error_every == 0:
                    token = token + 1  # a wrong guess now and then
                if token == END_ID:
                    break
                out.append(token)
        else:
            # Verification, then (fill) ordinary generation up to request_output_len.
            draft = inputs["draft_input_ids"].reshape(-1).tolist() if "draft_input_ids" in inputs else []
            for i in range(n):
                token = self._next(seq + out)
                if token == END_ID:
                    break
                out.append(token)
                if not self.fill and (i >= len(draft) or draft[i] != token):
                    break
        yield {"output_ids": np.array([[out]], dtype=np.int32).reshape(1, 1, -1),
               "sequence_length": np.array([[len(out)]], dtype=np.int32)}


def greedy_reference(prompt, max_tokens, end_after=None):
    seq = list(prompt)
    while len(seq) - len(prompt) < max_tokens:
        token = END_ID if end_after is not None and len(seq) >= end_after else target_next(seq)
        if token == END_ID:
            break
        seq.append(token)
    return seq[len(prompt):]


def run(engines, prompt, max_tokens, k, stop_words=None):
    inputs = {"input_ids": np.array([prompt], np.int32), "request_output_len": np.array([[max_tokens]], np.int32),
              "end_id": np.array([[END_ID]], np.int32)}
    if stop_words is not None:
        inputs["stop_words_list"] = stop_words
    chunks = []
    stats = DraftTargetDecoder(engines, "target", "draft").run(inputs, k, "r", lambda t, _: chunks.append(t) or True)
    return [t for c in chunks for t in c], stats


@pytest.mark.parametrize("fill", [True, False])
def test_output_equals_target_greedy_for_any_draft_length(fill):
    prompt = [5, 9, 11]
    for k in (1, 2, 4, 7):
        tokens, stats = run(FakeEngines(fill=fill), prompt, 40, k)
        assert tokens == greedy_reference(prompt, 40)
        assert stats.finish_reason == "length"
        assert 0 < stats.accepted_tokens < stats.draft_tokens


def test_exact_max_tokens_and_no_draft_beyond_it():
    engines = FakeEngines(draft_error_every=10**9)
    tokens, stats = run(engines, [4, 6], 10, 4)
    assert len(tokens) == 10 and stats.acceptance_rate == 1.0
    for _model, seq_len, n in engines.calls:  # never asks for more than what is left
        assert seq_len - 2 + n <= 10


@pytest.mark.parametrize("fill", [True, False])
@pytest.mark.parametrize("end_after", [6, 9, 13])
def test_end_id_detected_in_the_same_round(fill, end_after):
    engines = FakeEngines(end_after=end_after, fill=fill)
    tokens, stats = run(engines, [5, 9, 11], 40, 4)
    assert tokens == greedy_reference([5, 9, 11], 40, end_after=end_after)
    assert stats.finish_reason == "stop"
    target_calls = [c for c in engines.calls if c[0] == "target"]
    assert target_calls[-1][1] <= end_after  # no extra round after the end


def test_stop_word_spanning_two_rounds_is_found():
    reference = greedy_reference([5, 9, 11], 40)
    word = reference[5:7]
    stop = np.array([[word, [2, -1]]], dtype=np.int32).reshape(1, 2, 2)
    tokens, stats = run(FakeEngines(), [5, 9, 11], 40, 3, stop_words=stop)
    assert tokens == reference[:7] and stats.finish_reason == "stop"


def test_word_sequences_uses_offsets_not_rows():
    # two words [10, 11] and [12]; upstream's bug compared the offsets row as if it were a word
    words = np.array([[[10, 11, 12], [2, 3, -1]]], dtype=np.int32)
    assert WordList.from_tensor("stop_words_list", words).words == ((10, 11), (12,))
    assert WordList.from_tensor("stop_words_list", np.array([[[0], [-1]]], dtype=np.int32)).words == ()


def test_truncate_at_stop_word():
    assert WordList(((2, 3),)).truncate_after_first([1, 2], [3, 4, 5]) == ([3], True)
    assert WordList(((4,),)).truncate_after_first([1], [3, 4, 5]) == ([3, 4], True)
    assert WordList(((9,),)).truncate_after_first([1], [3, 4, 5]) == ([3, 4, 5], False)


def test_a_round_cancelled_under_way_ends_the_generation_as_cancelled():
    """RelayedEngineStreams.cancel makes an open round raise GenerationCancelled (the client went away)."""
    from bls.errors import GenerationCancelled

    class CancelledInThirdRound(FakeEngines):
        def stream(self, model_name, inputs, outputs, request_id=""):
            if len(self.calls) == 4:  # the third round's draft call
                raise GenerationCancelled(request_id)
            yield from super().stream(model_name, inputs, outputs, request_id)

    tokens, stats = run(CancelledInThirdRound(), [5, 9, 11], 40, 2)
    assert stats.finish_reason == "cancelled" and stats.rounds == 2
    assert tokens == greedy_reference([5, 9, 11], 40)[:len(tokens)] and tokens
