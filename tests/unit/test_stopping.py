import numpy as np
import pytest

from bls.errors import InvalidRequest
from bls.finish_reason import FinishReason
from bls.word_lists import WordList
from embedded_engine.stopping import StopCriteria

VOCAB = 100


def word_list(ids, offsets):
    return WordList.from_tensor("stop_words_list", np.array([ids, offsets], np.int32), VOCAB)


def test_parses_words_from_ids_and_end_offsets_with_padding():
    # Two words, "[5 6]" and "[7]", padded to 4 columns the way preprocessing pads (ids 0, offsets -1).
    words = word_list([5, 6, 7, 0], [2, 3, -1, -1])
    assert words.words == ((5, 6), (7,))


@pytest.mark.parametrize("tensor", [np.array([[0], [-1]], np.int32), np.zeros((2, 0), np.int32)])
def test_empty_lists_mean_no_words(tensor):
    words = WordList.from_tensor("bad_words_list", tensor, VOCAB)
    assert not words
    assert not words.ends([1, 2, 3])


@pytest.mark.parametrize(
    "ids, offsets, problem",
    [
        ([5, 6, 7], [2, 2, -1], "strictly increasing"),
        ([5, 6, 7], [2, 1, -1], "strictly increasing"),
        ([5, 6, 7], [0, -1, -1], "strictly increasing"),
        ([5, 6, 7], [2, 4, -1], "beyond the 3 ids"),
        ([5, 600, 7], [2, 3, -1], "outside the vocabulary"),
    ],
)
def test_malformed_lists_are_rejected_naming_the_field(ids, offsets, problem):
    with pytest.raises(InvalidRequest) as error:
        word_list(ids, offsets)
    assert error.value.field == "stop_words_list"
    assert problem in error.value.problem


def test_wrong_shape_is_rejected():
    with pytest.raises(InvalidRequest, match=r"shape \[2, N\]"):
        WordList.from_tensor("stop_words_list", np.zeros((3, 2), np.int32), VOCAB)


def test_ends_matches_the_tail_only_from_start():
    words = word_list([5, 6, 7], [2, 3, -1])
    assert words.ends([1, 5, 6])
    assert words.ends([1, 7])
    assert not words.ends([5, 6, 1])
    # The prompt is [1, 5]; only the generated [6] is searched, so the two-token word does not match.
    assert not words.ends([1, 5, 6], start=2)
    assert words.ends([1, 5, 6], start=1)


def test_completing_tokens_are_single_words_and_multi_word_tails():
    words = word_list([5, 6, 9, 7], [3, 4, -1, -1])  # [5 6 9] and [7]
    assert words.completing_tokens([1, 2]) == {7}
    assert words.completing_tokens([1, 5, 6]) == {7, 9}
    assert words.completing_tokens([5]) == {7}


def test_stop_criteria_reasons():
    criteria = StopCriteria(end_id=2, stop_words=word_list([8, 9], [2, -1]), max_new_tokens=3)
    assert criteria.is_end(2) and not criteria.is_end(3)
    prompt_len = 2
    assert criteria.reason_after_append([1, 1, 8], prompt_len) is None
    assert criteria.reason_after_append([1, 1, 8, 9], prompt_len) == FinishReason.STOP_WORDS
    assert criteria.reason_after_append([1, 1, 4, 4, 4], prompt_len) == FinishReason.LENGTH
    assert not StopCriteria(None, WordList(), 5).is_end(0)
