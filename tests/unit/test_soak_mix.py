"""The soak's request mix and `--weight` overrides (tools/soak.py)."""

import random

import pytest

from tools.soak import MIX, draw, mix_weights


def test_no_override_keeps_the_mix():
    assert mix_weights([]) == [weight for _, weight, _ in MIX]


def test_an_override_replaces_one_share_and_zero_leaves_a_workload_out():
    weights = mix_weights(["disconnect_http=0.5", "bad_input=0"])
    names = [name for name, _, _ in MIX]
    assert weights[names.index("disconnect_http")] == 0.5
    assert weights[names.index("bad_input")] == 0
    drawn = {draw(random.Random(seed), weights)[0] for seed in range(400)}
    assert "bad_input" not in drawn and "disconnect_http" in drawn


@pytest.mark.parametrize("item, message", [
    ("disconect_http=0.5", "no workload 'disconect_http'"),
    ("disconnect_http=lots", "must be a number"),
    ("disconnect_http=-1", "must be >= 0"),
    ("disconnect_http=nan", "must be >= 0"),
])
def test_a_bad_override_is_refused_by_name(item, message):
    with pytest.raises(ValueError, match=message):
        mix_weights([item])


def test_a_mix_of_nothing_is_refused():
    with pytest.raises(ValueError, match="every workload's weight is 0"):
        mix_weights([f"{name}=0" for name, _, _ in MIX])
