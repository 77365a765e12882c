"""The device mesh: ordered named axes with sizes.

A :class:`Mesh` is a value (names and sizes) with an optional communicator
attached.  Planning only needs the sizes, so any mesh, e.g. 4096 devices,
can be planned without MPI.  Rank ``r`` has coordinates
``numpy.unravel_index(r, sizes)``: row-major, last axis fastest.

A mesh may cover only some ranks of its communicator: ``ranks`` lists them
in device order (device ``i`` is rank ``ranks[i]``).  Such a mesh is a
source or target of :func:`mpiredist.redistribute` between meshes; every
rank of the communicator takes part in those calls.
"""

import itertools
import math
import operator
import re

from .errors import MeshError

__all__ = ["Mesh", "parse_ranks", "format_ranks", "MAX_DEVICES"]

# An MPI communicator's size is a C int: no mesh has more devices than this,
# and every rank is below it.
MAX_DEVICES = 2**31 - 1

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SIZE = re.compile(r"[+-]?[0-9]+\Z")
_RANK_RANGE = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?\Z")
# decimal digits of MAX_DEVICES: longer numbers are too large without converting them
# (int() of thousands of digits is slow, and refused past 4300)
_DIGITS = len(str(MAX_DEVICES))


def _shown(value):
    """``repr(value)``, or a description where Python refuses to print it (huge ints)."""
    try:
        return repr(value)
    except ValueError:      # Python prints no integer of more than 4300 digits
        if isinstance(value, int):
            return f"an integer of {value.bit_length()} bits"
        return f"a {type(value).__name__} holding an integer too large to print"


def _parse_axes(axes):
    if isinstance(axes, Mesh):
        return axes.axes
    if isinstance(axes, str):
        items = []
        for part in filter(None, (p.strip() for p in axes.split(","))):
            name, sep, size = part.partition("=")
            name, size = name.strip(), size.strip()
            if not sep:
                raise MeshError(f"mesh {axes!r}: expected NAME=SIZE, found {part!r}")
            if not _SIZE.match(size):
                raise MeshError(f"mesh {axes!r}: size of axis {name!r} "
                                f"is not an integer: {size!r}")
            if len(size.lstrip("+-").lstrip("0")) > _DIGITS:
                raise MeshError(f"mesh {axes!r}: axis {name!r} has size {size}; expected "
                                f"a positive integer of at most {MAX_DEVICES} (the most "
                                "ranks an MPI communicator has)")
            items.append((name, int(size)))
        return tuple(items)
    if hasattr(axes, "items"):
        return tuple(axes.items())
    if isinstance(axes, (bytes, bytearray)) or not hasattr(axes, "__iter__"):
        raise MeshError(f"mesh {_shown(axes)}: expected a dict, text like 'x=2,y=4' or "
                        "(name, size) pairs")
    items = []
    for item in axes:
        pair = () if isinstance(item, (str, bytes, bytearray)) \
            or not hasattr(item, "__iter__") else tuple(item)
        if len(pair) != 2:
            raise MeshError(f"mesh axis {_shown(item)}: expected a (name, size) pair")
        items.append(pair)
    return tuple(items)


def _validate(items):
    seen, done, devices = set(), [], 1
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise MeshError(f"mesh axis {_shown(item)}: expected (name, size)")
        name, size = item
        if not isinstance(name, str) or not _NAME.match(name):
            raise MeshError(f"mesh axis name {_shown(name)} is not an identifier")
        if name in seen:
            raise MeshError(f"mesh axis {name!r} appears twice")
        seen.add(name)
        try:
            n = None if isinstance(size, bool) else operator.index(size)
        except TypeError:
            n = None
        if n is None or not 1 <= n <= MAX_DEVICES:
            raise MeshError(f"mesh axis {name!r} has size {_shown(size)}; expected a "
                            f"positive integer of at most {MAX_DEVICES} (the most ranks "
                            "an MPI communicator has)")
        done.append(f"{name}={n}")
        devices *= n
        if devices > MAX_DEVICES:
            raise MeshError(f"mesh axes {','.join(done)} make {devices} devices; a mesh has "
                            f"at most {MAX_DEVICES} (the most ranks an MPI communicator has)")


class Mesh:
    """Ordered named mesh axes, optionally bound to an MPI communicator.

    Parameters
    ----------
    axes : dict, sequence of (name, size) pairs, str or Mesh
        Axis names and sizes in order, e.g. ``{"x": 2, "y": 4}`` or
        ``"x=2,y=4"``; at most :data:`MAX_DEVICES` devices in all.
    comm : mpi4py.MPI.Comm, optional
        The communicator whose ranks form the mesh.  ``None`` means
        ``MPI.COMM_WORLD`` when the mesh is used to run a plan; planning never
        needs it.
    ranks : sequence of int, optional
        The ranks of ``comm`` that are the mesh's devices, in row-major
        device order.  ``None`` (the default): all ranks ``0..size-1``.
        ``"auto"`` (a target mesh only): every rank, in the order that
        moves the fewest bytes from the source, chosen by the planning of
        the redistribution (:func:`mpiredist.planning.crossmesh.relabel`).
        Text like ``"0-3,6"`` (:func:`parse_ranks`) is accepted too.  Their
        count must be the mesh's size and each an integer from 0 to
        ``MAX_DEVICES - 1``; that they are distinct and inside the
        communicator is checked, on every rank, by the calls that run on
        the mesh.

    Examples
    --------
    >>> Mesh({"x": 2, "y": 4}).coords(5)
    (1, 1)
    """

    __slots__ = ("_axes", "_comm", "_ranks")

    def __init__(self, axes, comm=None, ranks=None):
        if isinstance(axes, Mesh) and ranks is None:
            ranks = axes.ranks
        items = _parse_axes(axes)
        _validate(items)
        items = tuple((n, int(s)) for n, s in items)
        object.__setattr__(self, "_axes", items)
        object.__setattr__(self, "_comm", comm)
        object.__setattr__(self, "_ranks", _parse_ranks(ranks, math.prod(s for _, s in items)))

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

    @property
    def ranks(self):
        """The communicator ranks of the devices (a tuple), or ``None`` for all."""
        return self._ranks

    @property
    def auto(self):
        """True for ``ranks="auto"``: the order is chosen by a redistribution."""
        return self._ranks == "auto"

    def device_ranks(self):
        """Communicator rank of each device: ``ranks``, or ``0..size-1``."""
        if self.auto:
            raise MeshError(f"mesh {self}: ranks='auto' are chosen by a redistribution "
                            "to it (give the source mesh and layout)")
        return self._ranks if self._ranks is not None else tuple(range(self.size))

    def is_whole(self, comm_size):
        """True if the mesh is every rank of a ``comm_size``-rank communicator, in order."""
        return self.size == comm_size and self.device_ranks() == tuple(range(comm_size))

    def check_ranks(self, comm_size, which="the"):
        """MeshError unless the devices are distinct ranks of a ``comm_size``-rank communicator."""
        ranks = self.device_ranks()
        if self._ranks is None and self.size != comm_size:
            raise MeshError(f"{which} mesh {self} has {self.size} devices but the "
                            f"communicator has {comm_size} ranks; give its ranks with "
                            "Mesh(..., ranks=...)")
        bad = [r for r in ranks if not 0 <= r < comm_size]
        if bad:
            raise MeshError(f"{which} mesh {self}: ranks {bad} are outside the "
                            f"communicator of {comm_size} ranks")
        if len(set(ranks)) != len(ranks):
            twice = sorted({r for r in ranks if ranks.count(r) > 1})
            raise MeshError(f"{which} mesh {self}: ranks {twice} appear more than once")

    def abstract(self):
        """Return the same mesh without a communicator."""
        return Mesh(self._axes, None, self._ranks)

    def with_comm(self, comm):
        """Return the same mesh bound to ``comm``."""
        return Mesh(self._axes, comm, self._ranks)

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
        """Equal axes, ranks and communicator (the same handle; ``None``, the
        default ``COMM_WORLD``, equals only ``None``).  Planning uses
        :meth:`abstract` meshes, which have none."""
        return isinstance(other, Mesh) and self._axes == other._axes \
            and self._ranks == other._ranks and _same_comm(self._comm, other._comm)

    def __hash__(self):
        return hash(("Mesh", self._axes, self._ranks))      # communicators are unhashable

    def __repr__(self):
        if self._ranks is None:
            return f"Mesh({dict(self._axes)!r})"
        ranks = "'auto'" if self.auto else repr(list(self._ranks))
        return f"Mesh({dict(self._axes)!r}, ranks={ranks})"

    def __str__(self):
        text = ",".join(f"{n}={s}" for n, s in self._axes)
        if self._ranks is None:
            return text
        return f"{text}@auto" if self.auto else f"{text}@{format_ranks(self._ranks)}"


def _same_comm(a, b):
    """True if ``a`` and ``b`` are the same communicator (mpi4py compares handles)."""
    if a is None or b is None:
        return a is b
    return a is b or a == b


def _parse_ranks(ranks, size):
    """``ranks`` as a tuple of ints (or None, or "auto"); MeshError unless ``size`` of them."""
    if ranks is None or (isinstance(ranks, str) and ranks.strip() == "auto"):
        return None if ranks is None else "auto"
    if isinstance(ranks, str):
        return parse_ranks(ranks, size)
    if isinstance(ranks, (bytes, bytearray)) or not hasattr(ranks, "__iter__"):
        raise MeshError(f"mesh ranks must be integers, found {_shown(ranks)}")
    out = []
    for r in itertools.islice(ranks, size + 1):      # never more than the mesh needs
        try:
            value = None if isinstance(r, bool) else operator.index(r)
        except TypeError:
            value = None
        if value is None:
            raise MeshError(f"mesh ranks must be integers, found {_shown(r)} "
                            f"at position {len(out)}")
        if not 0 <= value < MAX_DEVICES:
            raise MeshError(f"mesh rank {_shown(value)} at position {len(out)} is not "
                            f"an MPI rank (0 to {MAX_DEVICES - 1})")
        out.append(value)
    if len(out) != size:
        given = len(out) if len(out) <= size else f"more than {size}"
        raise MeshError(f"mesh of {size} devices given {given} ranks {out[:size]}")
    return tuple(out)


def parse_ranks(text, size=None):
    """``"0-3,6"`` -> ``(0, 1, 2, 3, 6)`` (ranges inclusive, order kept).

    ``size``, if given, is the number of ranks the text must name (a mesh's
    size); it is checked before any rank is built, so that a range such as
    ``0-100000000000`` fails at once.  Ranks are ASCII decimal integers from
    0 to ``MAX_DEVICES - 1``; a range ``N-M`` needs ``N <= M``.
    """
    if not isinstance(text, str):
        raise MeshError(f"ranks must be text like '0-3,6', found {_shown(text)}")
    ranges = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = _RANK_RANGE.match(part)
        if not m:
            raise MeshError(f"ranks {text!r}: expected N or N-M (non-negative integers), "
                            f"found {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        for n in (lo, hi):
            if len(n.lstrip("0")) > _DIGITS or int(n) >= MAX_DEVICES:
                raise MeshError(f"ranks {text!r}: {n} is past the largest MPI rank "
                                f"{MAX_DEVICES - 1}")
        lo, hi = int(lo), int(hi)
        if hi < lo:
            raise MeshError(f"ranks {text!r}: range {part!r} runs backwards (write "
                            "descending ranks one by one)")
        ranges.append((lo, hi + 1))
    count = sum(hi - lo for lo, hi in ranges)
    if size is not None and count != size:
        raise MeshError(f"mesh of {size} devices given {count} ranks {text!r}")
    return tuple(r for lo, hi in ranges for r in range(lo, hi))


def format_ranks(ranks):
    """The inverse of :func:`parse_ranks`: ``(0, 1, 2, 3, 6)`` -> ``"0-3,6"``."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if j - i < 2 else f"{ranks[i]}-{ranks[j]}")
        if 0 < j - i < 2:
            parts.append(str(ranks[j]))
        i = j + 1
    return ",".join(parts)
