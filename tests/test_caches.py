"""core.caches: the per-object cache and the most-recent cache (serial)."""

from mpiredist.core.caches import PerObject, recent


class Held:
    def __init__(self, name):
        self.name, self.freed = name, False

    def free(self):
        self.freed = True


def test_per_object_computes_once_per_live_object():
    calls = []
    cache = PerObject(2)
    a, b, c = object(), object(), object()

    def make(obj):
        calls.append(obj)
        return len(calls)

    assert [cache.get(a, make), cache.get(a, make), cache.get(b, make)] == [1, 1, 2]
    assert cache.get(c, make) == 3 and len(cache) == 2     # a dropped, the oldest
    assert cache.get(a, make) == 4 and calls == [a, b, c, a]


def test_per_object_checks_identity_not_only_id():
    cache = PerObject(4)
    first = cache.get([1], lambda obj: "first")
    second = cache.get([2], lambda obj: "second")   # may reuse the id of a freed list
    assert (first, second) == ("first", "second")


def test_recent_keeps_the_most_recently_used_and_frees_the_rest():
    cache = {}
    made = {k: Held(k) for k in "abc"}
    assert recent(cache, "a", lambda: made["a"], 2) is made["a"]
    assert recent(cache, "b", lambda: made["b"], 2) is made["b"]
    assert recent(cache, "a", lambda: Held("again"), 2) is made["a"]    # a hit
    recent(cache, "c", lambda: made["c"], 2)                # b is the least recent
    assert list(cache) == ["a", "c"]
    assert made["b"].freed and not made["a"].freed and not made["c"].freed
