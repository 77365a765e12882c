"""The two kinds of cache the package keeps, each written once.

:class:`PerObject`
    a value worked out once per live object (a plan's buffer size, a torch
    DeviceMesh's ranks), looked up by the object's identity.  The object is
    kept with its value, so its ``id`` cannot be reused by another while the
    entry lives; at most ``most`` entries, the oldest dropped first.
:func:`recent`
    objects that hold MPI resources (a Transfer, an Exchange), kept by key in
    a dict that the caller owns (one per communicator, see
    :func:`mpiredist.runtime.groups.kept`), most recently used last; past
    ``most`` entries the least recently used is dropped and its ``free()``
    called (local, no communication).

Both are local to a rank: a hit or a miss never changes which MPI calls run
by itself (the callers agree on the key first, or name it in the agreement).

>>> sizes = PerObject(2)
>>> key = object()
>>> sizes.get(key, lambda k: 7), sizes.get(key, lambda k: 8)
(7, 7)
"""

__all__ = ["PerObject", "recent"]


class PerObject:
    """Values computed once per object, by identity (see the module doc)."""

    def __init__(self, most):
        self._most = most
        self._found = {}        # id(object) -> (the object, its value)

    def __repr__(self):
        return f"PerObject({len(self._found)} of at most {self._most})"

    def __len__(self):
        return len(self._found)

    def get(self, obj, make):
        """The value of ``obj``: kept, or ``make(obj)`` kept now."""
        found = self._found.get(id(obj))
        if found is not None and found[0] is obj:
            return found[1]
        value = make(obj)
        self._found[id(obj)] = (obj, value)
        while len(self._found) > self._most:
            self._found.pop(next(iter(self._found)))
        return value


def recent(cache, key, make, most):
    """``cache[key]``, or ``make()`` kept under ``key``; the entry becomes the most
    recently used, and past ``most`` entries the least recently used is
    removed and freed (``free()``)."""
    found = cache.pop(key, None)
    if found is None:
        found = make()
    cache[key] = found
    while len(cache) > most:
        cache.pop(next(iter(cache))).free()
    return found
