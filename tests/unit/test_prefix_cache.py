"""The store behind KV-cache reuse: longest-prefix lookup, exclusivity, bounds (engine-level tests: test_scheduler)."""

from embedded_engine.prefix_cache import PrefixCache, PrefixCacheLimits


def test_miss_when_empty_or_nothing_shared():
    cache = PrefixCache()
    assert cache.take([1, 2, 3]) is None
    cache.put([1, 2, 3], "a")
    assert cache.take([7, 2, 3]) is None
    assert len(cache) == 1  # a miss takes nothing


def test_hit_takes_the_entry_out_so_one_request_uses_it_at_a_time():
    cache = PrefixCache()
    cache.put([1, 2, 3, 4], "a")
    hit = cache.take([1, 2, 3, 4, 5, 6])
    assert (hit.cache, hit.length) == ("a", 4)
    assert cache.take([1, 2, 3, 4, 5, 6]) is None and len(cache) == 0 and cache.tokens == 0
    cache.put([1, 2, 3, 4, 5], "a")  # back, longer, when its request ends
    assert cache.take([1, 2, 3, 4, 5, 6]).length == 5


def test_the_last_prompt_token_is_always_left_to_feed():
    cache = PrefixCache()
    cache.put([1, 2, 3, 4], "a")
    assert cache.take([1, 2, 3]).length == 2  # the same prompt again, or a prefix of the entry
    cache.put([1, 2, 3, 4], "a")
    assert cache.take([1]) is None  # nothing left to reuse


def test_partial_prefix_and_the_longest_match_wins():
    cache = PrefixCache()
    cache.put([1, 2, 3, 4], "short")
    cache.put([1, 2, 3, 9, 9, 9], "long")
    cache.put([1, 2, 3, 4], "newer")
    assert cache.take([1, 2, 3, 9, 9, 8, 8]).cache == "long"  # rejected-draft shape: shared up to position 5
    hit = cache.take([1, 2, 3, 4, 5])
    assert (hit.cache, hit.length) == ("newer", 4)  # ties go to the most recently parked


def test_a_short_shared_head_does_not_take_a_long_entry():
    cache = PrefixCache()
    cache.put(list(range(100)), "conversation")
    assert cache.take([0, 1, 2, 3, 500, 501]) is None  # a system prompt in common: leave it to its owner
    assert cache.take(list(range(60)) + [7]).length == 60


def test_eviction_by_entries_and_by_tokens_least_recently_parked_first():
    cache = PrefixCache(PrefixCacheLimits(max_entries=2, max_tokens=10))
    cache.put([1, 1], "a")
    cache.put([2, 2], "b")
    cache.put([3, 3], "c")
    assert len(cache) == 2 and cache.take([1, 1, 0]) is None
    cache.put([4] * 7, "d")  # 3 entries, 11 tokens: evicting the oldest ("b") brings both back in bounds
    assert len(cache) == 2 and cache.tokens == 9
    assert cache.take([2, 2, 0]) is None and cache.take([3, 3, 0]).cache == "c"
    cache.put([5] * 11, "too long")  # longer than the whole budget: not kept
    assert cache.take([5] * 12) is None and cache.tokens == 7
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0
