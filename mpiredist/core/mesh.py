"""The device mesh: ordered named axes with sizes.

A :class:`Mesh` is a value (names and sizes) with an optional communicator
attached.  Planning only needs the sizes, so any mesh, e.g. 4096 devices,
can be planned without MPI.  Rank ``r`` has coordinates
``numpy.unravel_index(r, sizes)``: row-major, last axis fastest.
"""

import math
import re

from .errors import MeshError

__all__ = ["Mesh"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _parse_axes(axes):
    if isinstance(axes, Mesh):
        return axes.axes
    if isinstance(axes, str):
        items = []
        for part in filter(None, (p.strip() for p in axes.split(","))):
            name, sep, size = part.partition("=")
            if not sep:
                raise MeshError(f"mesh {axes!r}: expected NAME=SIZE, found {part!r}")
            try:
                items.append((name.strip(), int(size)))
            except ValueError:
                raise MeshError(f"mesh {axes!r}: size of axis {name.strip()!r} "
                                f"is not an integer: {size!r}") from None
        return tuple(items)
    if hasattr(axes, "items"):
        return tuple(axes.items())
    return tuple(tuple(item) for item in axes)


def _validate(items):
    seen = set()
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise MeshError(f"mesh axis {item!r}: expected (name, size)")
        name, size = item
        if not isinstance(name, str) or not _NAME.match(name):
            raise MeshError(f"mesh axis name {name!r} is not an identifier")
        if name in seen:
            raise MeshError(f"mesh axis {name!r} appears twice")
        seen.add(name)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise MeshError(f"mesh axis {name!r} has size {size!r}; "
                            "expected a positive integer")


class Mesh:
    """Ordered named mesh axes, optionally bound to an MPI communicator.

    Parameters
    ----------
    axes : dict, sequence of (name, size) pairs, str or Mesh
        Axis names and sizes in order, e.g. ``{"x": 2, "y": 4}`` or
        ``"x=2,y=4"``.
    comm : mpi4py.MPI.Comm, optional
        The communicator whose ranks form the mesh.  ``None`` means
        ``MPI.COMM_WORLD`` when the mesh is used to run a plan; planning never
        needs it.

    Examples
    --------
    >>> Mesh({"x": 2, "y": 4}).coords(5)
    (1, 1)
    """

    __slots__ = ("_axes", "_comm")

    def __init__(self, axes, comm=None):
        items = _parse_axes(axes)
        _validate(items)
        items = tuple((n, int(s)) for n, s in items)
        object.__setattr__(self, "_axes", items)
        object.__setattr__(self, "_comm", comm)

    def __setattr__(self, name, value):
        raise AttributeError("Mesh is immutable")

    @property
    def axes(self):
        """Tuple of ``(name, size)`` pairs in mesh order."""
        return self._axes

    @property
    def names(self):
        return tuple(n for n, _ in self._axes)

    @property
    def sizes(self):
        return tuple(s for _, s in self._axes)

    @property
    def size(self):
        """Number of devices (ranks): the product of the axis sizes."""
        return math.prod(self.sizes)

    @property
    def comm(self):
        """The attached communicator, or ``None`` (meaning ``COMM_WORLD``)."""
        return self._comm

    def abstract(self):
        """Return the same mesh without a communicator."""
        return Mesh(self._axes)

    def with_comm(self, comm):
        """Return the same mesh bound to ``comm``."""
        return Mesh(self._axes, comm)

    def axis_size(self, name):
        """Size of mesh axis ``name``; :class:`MeshError` if there is none."""
        for n, s in self._axes:
            if n == name:
                return s
        raise MeshError(f"mesh {self} has no axis {name!r}; "
                        f"its axes are {list(self.names)}")

    def coords(self, rank):
        """Coordinates of ``rank``: row-major, last axis fastest."""
        if not 0 <= rank < self.size:
            raise MeshError(f"rank {rank} is outside mesh {self} of {self.size} ranks")
        out = []
        for size in reversed(self.sizes):
            rank, c = divmod(rank, size)
            out.append(c)
        return tuple(reversed(out))

    def rank(self, coords):
        """Rank at ``coords`` (inverse of :meth:`coords`)."""
        r = 0
        for c, size in zip(coords, self.sizes):
            r = r * size + c
        return r

    def __eq__(self, other):
        return isinstance(other, Mesh) and self._axes == other._axes

    def __hash__(self):
        return hash(("Mesh", self._axes))

    def __repr__(self):
        return f"Mesh({dict(self._axes)!r})"

    def __str__(self):
        return ",".join(f"{n}={s}" for n, s in self._axes)
