"""Prime-factor sub-axes: the planner's view of a mesh.

A mesh axis of size 8 is three sub-axes of size 2 (``x:0`` major, ``x:2``
minor), one of size 6 is ``2*3``.  A layout over whole axes is the same
layout over their sub-axes in order, so the planner can move part of an axis
(``x:1``) without touching the rest.  Digits follow the mixed-radix order of
the axis coordinate, major first.
"""

import math
from functools import lru_cache

__all__ = ["SubAxis", "SubLayout", "prime_factors", "sub_axes", "mesh_sub_axes", "expand",
           "group_size", "group_str", "rank_digits"]


@lru_cache(maxsize=1024)
def prime_factors(n):
    """Prime factors of ``n`` in ascending order; ``()`` for 1."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return tuple(out)


class SubAxis(tuple):
    """Digit ``index`` of mesh axis ``name``: ``SubAxis(name, index, size, count)``.

    ``count`` is how many sub-axes the axis has; ``stride`` is the product of
    the sizes of the more minor digits of the same axis.
    """

    __slots__ = ()

    def __new__(cls, name, index, size, count, stride):
        return tuple.__new__(cls, (name, index, size, count, stride))

    name = property(lambda self: self[0])
    index = property(lambda self: self[1])
    size = property(lambda self: self[2])
    count = property(lambda self: self[3])
    stride = property(lambda self: self[4])

    def __repr__(self):
        return f"SubAxis({self.name!r}, {self.index}, {self.size}, {self.count}, {self.stride})"

    def __str__(self):
        return self.name if self.count == 1 else f"{self.name}:{self.index}"


@lru_cache(maxsize=256)
def sub_axes(mesh_axes):
    """Map each axis name of ``mesh_axes`` (tuple of pairs) to its sub-axes."""
    out = {}
    for name, size in mesh_axes:
        factors = prime_factors(size)
        strides = [math.prod(factors[i + 1:]) for i in range(len(factors))]
        out[name] = tuple(SubAxis(name, i, f, len(factors), s)
                          for i, (f, s) in enumerate(zip(factors, strides)))
    return out


def mesh_sub_axes(mesh_axes, keep=None):
    """Sub-axes of ``mesh_axes`` in mesh order, major digits first (those in ``keep``).

    With every sub-axis, the mixed-radix number of a rank's digits in this
    order is the rank itself.
    """
    subs = sub_axes(mesh_axes)
    return tuple(s for name, _ in mesh_axes for s in subs[name] if keep is None or s in keep)


@lru_cache(maxsize=4096)
def group_size(group):
    """Number of ranks in a sub-axis group (a tuple of SubAxis)."""
    return math.prod(s.size for s in group)


def group_str(group):
    """Compact text of a sub-axis group: whole axes by name, parts as ``x:1``."""
    parts, i, group = [], 0, tuple(group)
    while i < len(group):
        s = group[i]
        run = group[i:i + s.count]
        if s.index == 0 and len(run) == s.count and all(
                r.name == s.name and r.index == j for j, r in enumerate(run)):
            parts.append(s.name)
            i += s.count
        else:
            parts.append(str(s))
            i += 1
    return ",".join(parts)


class SubLayout(tuple):
    """A layout over sub-axes: ``(dims, partial, op)``, each dim a tuple of SubAxis."""

    __slots__ = ()

    def __new__(cls, dims, partial=(), op="sum"):
        partial = tuple(sorted(partial))    # a set: its order means nothing
        # Like Layout: the op means nothing without partial axes.
        return tuple.__new__(cls, (tuple(tuple(d) for d in dims), partial,
                                   op if partial else "sum"))

    dims = property(lambda self: self[0])
    partial = property(lambda self: self[1])
    op = property(lambda self: self[2])

    def used(self):
        return frozenset(a for d in self.dims for a in d)

    def counts(self):
        """Number of shards of each dim."""
        return tuple(group_size(d) for d in self.dims)

    def replace(self, dims=None, partial=None):
        return SubLayout(self.dims if dims is None else dims,
                         self.partial if partial is None else partial, self.op)

    def __repr__(self):
        return f"SubLayout({self.dims!r}, {self.partial!r}, {self.op!r})"

    def __str__(self):
        text = "[" + ", ".join("{" + group_str(d) + "}" for d in self.dims) + "]"
        if self.partial:
            text += f" {self.op}{{{group_str(self.partial)}}}"
        return text


def expand(layout, mesh):
    """The :class:`SubLayout` equal to ``layout`` on ``mesh``."""
    subs = sub_axes(mesh.axes)
    dims = tuple(tuple(s for a in d for s in subs[a]) for d in layout.dims)
    partial = tuple(s for a in layout.partial for s in subs[a])
    return SubLayout(dims, partial, layout.op)


def rank_digits(mesh, rank):
    """Dict ``SubAxis -> digit`` of ``rank`` on ``mesh``."""
    subs = sub_axes(mesh.axes)
    out = {}
    for (name, _), c in zip(mesh.axes, mesh.coords(rank)):
        for s in subs[name]:
            out[s] = (c // s.stride) % s.size
    return out
