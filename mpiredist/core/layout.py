"""Layouts: which mesh axes shard which array dimension.

Text form (``parse`` and ``str`` round-trip)::

    [{x,y}, {}]            dim 0 over x (major) and y (minor), dim 1 whole
    [{x}, {}] sum{y}       plus partial sums over y
    [{}, {}]               fully replicated
"""

import re
from collections.abc import Mapping
from functools import lru_cache

from .errors import LayoutError

__all__ = ["Layout", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "max", "min", "prod")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DIM = re.compile(r"\s*\{([^{}]*)\}\s*(,|\Z)")
_TEXT = re.compile(r"\s*\[(?P<dims>[^\]]*)\]\s*(?:(?P<op>[a-z]+)\s*\{(?P<partial>[^}]*)\}\s*)?\Z")


def _names(group, where):
    """The axis names of one ``{...}`` group: none, or names each between commas."""
    if not group.strip():
        return ()
    names = tuple(n.strip() for n in group.split(","))
    for n in names:
        if not n:
            raise LayoutError(f"layout {where!r}: empty axis name in {'{' + group + '}'!r} "
                              "(a stray comma?)")
        if not _NAME.match(n):
            raise LayoutError(f"layout {where!r}: {n!r} is not an axis name")
    return names


def _parse_dims(body, text):
    body = body.strip()        # so that a comma at the end is the body's last character
    dims, pos = [], 0
    while pos < len(body):
        # match at an offset: slicing the rest each time is quadratic in long texts
        m = _DIM.match(body, pos)
        if not m:
            raise LayoutError(f"layout {text!r}: expected '{{axes}}' per dimension, "
                              f"found {body[pos:].strip()!r}")
        dims.append(_names(m.group(1), text))
        pos = m.end()
    if body.endswith(","):
        raise LayoutError(f"layout {text!r}: trailing comma")
    return tuple(dims)


class Layout:
    """Per-dimension mesh axes (major to minor), plus optional partial axes.

    Parameters
    ----------
    dims : sequence of sequences of str
        For each array dimension, the mesh axes that shard it, major first.
    partial : sequence of str, optional
        Mesh axes over which every rank holds a partial result.
    op : {"sum", "max", "min", "prod"}
        The reduction that combines partial results.

    Examples
    --------
    >>> Layout.parse("[{x,y}, {}] sum{z}")
    Layout(dims=(('x', 'y'), ()), partial=('z',), op='sum')
    """

    __slots__ = ("dims", "partial", "op", "key")

    def __init__(self, dims, partial=(), op="sum"):
        if isinstance(dims, str):
            raise LayoutError(f"Layout({dims!r}): use Layout.parse for the text form")
        try:
            dims = tuple(tuple(d) if not isinstance(d, str) else (d,) for d in dims)
        except TypeError:
            raise LayoutError(f"layout dims {dims!r}: expected a sequence of sequences of "
                              "axis names, e.g. [['x'], []]") from None
        try:
            partial = (partial,) if isinstance(partial, str) else tuple(partial)
        except TypeError:
            raise LayoutError(f"layout partial axes {partial!r}: expected a sequence of "
                              "axis names, e.g. ['y']") from None
        if not isinstance(op, str) or op not in REDUCE_OPS:
            raise LayoutError(f"layout reduction {op!r} is not one of {REDUCE_OPS}")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "partial", partial)
        object.__setattr__(self, "op", op)
        self._check_names()
        # the value as a plain tuple (hashed in C: a dict key of it costs no Python
        # call); partial axes are a set: ``sum{x,y}`` equals ``sum{y,x}``
        object.__setattr__(self, "key", ("Layout", dims, tuple(sorted(partial)),
                                         op if partial else "sum"))

    def __setattr__(self, name, value):
        raise AttributeError("Layout is immutable")

    def _check_names(self):
        for axis in self.axes_used() + self.partial:
            if not isinstance(axis, str) or not _NAME.match(axis):
                # repr, not str: str(self) joins the names, which may not be text
                raise LayoutError(f"layout {self!r}: {axis!r} is not an axis name")
        seen = set()
        for axis in self.axes_used() + self.partial:
            if axis in seen:
                raise LayoutError(f"layout {self}: mesh axis {axis!r} is used twice")
            seen.add(axis)

    @classmethod
    def parse(cls, text):
        """Parse the text form, e.g. ``"[{x,y}, {}] sum{z}"``."""
        if isinstance(text, Layout):
            return text
        if not isinstance(text, str):
            raise LayoutError(f"layout must be text like '[{{x}}, {{}}]', found {text!r}")
        return _parse(text)

    @classmethod
    def _from_text(cls, text):
        m = _TEXT.match(text)
        if not m:
            raise LayoutError(f"layout {text!r}: expected '[{{axes}}, ...]' "
                              "optionally followed by 'sum{axes}'")
        dims = _parse_dims(m.group("dims"), text)
        partial, op = (), "sum"
        if m.group("op"):
            op = m.group("op")
            if op not in REDUCE_OPS:
                raise LayoutError(f"layout {text!r}: reduction {op!r} is not one of {REDUCE_OPS}")
            partial = _names(m.group("partial"), text)
        return cls(dims, partial, op)

    @staticmethod
    def from_placements(placements, mesh_dim_names, ndim):
        """The layout of PyTorch DTensor ``placements`` (``Shard``, ``Replicate``,
        ``Partial``) on a mesh with dims ``mesh_dim_names`` (see
        :mod:`mpiredist.core.placements`)."""
        from . import placements as rules
        dims, partial, op = rules.from_placements(placements, mesh_dim_names, ndim)
        if op not in REDUCE_OPS:
            raise LayoutError(f"placements {list(placements)}: partial op {op!r} is not one "
                              f"of {REDUCE_OPS} (an average is a sum divided afterwards)")
        return Layout(dims, partial, op)

    def to_placements(self, mesh_dim_names):
        """DTensor placements of this layout, one per mesh dim (needs torch)."""
        from . import placements as rules
        return rules.to_placements(self, mesh_dim_names)

    @staticmethod
    def from_partition_spec(spec, ndim=None):
        """The layout of a JAX ``PartitionSpec`` (see :mod:`mpiredist.core.placements`)."""
        from . import placements as rules
        return Layout(rules.from_partition_spec(spec, ndim))

    def to_partition_spec(self):
        """A ``jax.sharding.PartitionSpec`` of this layout (needs JAX)."""
        from . import placements as rules
        return rules.to_partition_spec(self)

    @classmethod
    def replicated(cls, ndim):
        """The fully replicated layout of an ``ndim``-dimensional array."""
        return cls(((),) * ndim)

    @classmethod
    def from_dict(cls, spec):
        """Build from ``{"dims": [[...], ...], "partial": [...], "op": ...}``."""
        if not isinstance(spec, Mapping) or "dims" not in spec:
            raise LayoutError(f"layout {spec!r}: expected a dict with 'dims' (and optional "
                              "'partial' and 'op'), as to_dict gives")
        return cls(spec["dims"], spec.get("partial", ()), spec.get("op", "sum"))

    @property
    def ndim(self):
        return len(self.dims)

    def axes_used(self):
        """Mesh axes that shard some dimension, in dimension order."""
        return tuple(a for d in self.dims for a in d)

    def validate(self, mesh, ndim=None):
        """Raise :class:`LayoutError` unless this layout fits ``mesh`` and ``ndim``."""
        names = set(mesh.names)
        for axis in self.axes_used() + self.partial:
            if axis not in names:
                raise LayoutError(f"layout {self} uses axis {axis!r}, which mesh {mesh} "
                                  f"does not have (its axes are {list(mesh.names)})")
        if ndim is not None and ndim != self.ndim:
            raise LayoutError(f"layout {self} has {self.ndim} dimension(s) but the array "
                              f"has {ndim}")
        return self

    def without_partial(self):
        return Layout(self.dims)

    def to_dict(self):
        out = {"dims": [list(d) for d in self.dims]}
        if self.partial:
            out["partial"] = list(self.partial)
            out["op"] = self.op
        return out

    def __eq__(self, other):
        return isinstance(other, Layout) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"Layout(dims={self.dims!r}, partial={self.partial!r}, op={self.op!r})"

    def __str__(self):
        text = "[" + ", ".join("{" + ",".join(d) + "}" for d in self.dims) + "]"
        if self.partial:
            text += f" {self.op}{{" + ",".join(self.partial) + "}"
        return text


@lru_cache(maxsize=1024)
def _parse(text):
    return Layout._from_text(text)
