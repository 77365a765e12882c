"""The device mesh: ordered named axes with sizes.

A :class:`Mesh` is a value (names and sizes) with an optional communicator
attached.  Planning only needs the sizes, so any mesh, e.g. 4096 devices,
can be planned without MPI.  Rank ``r`` has coordinates
``numpy.unravel_index(r, sizes)``: row-major, last axis fastest.

A mesh may cover only some ranks of its communicator, or all of them in
another order: ``ranks`` lists them in device order (device ``i`` is rank
``ranks[i]``).  A mesh over some ranks is a source or target of
:func:`mpiredist.redistribute` between meshes (every rank of the
communicator takes part in those calls); a mesh over every rank in another
order (:meth:`Mesh.hybrid` makes such) runs collectives like any other.
A mesh may know which node each device is on (``topology``, a
:class:`~mpiredist.core.topology.Topology`): :meth:`Mesh.node_axes`.
"""

import itertools
import math
import operator
import re

import numpy as np

from .errors import MeshError
from .subaxes import group_str, mesh_sub_axes
from .topology import Topology

__all__ = ["Mesh", "parse_ranks", "format_ranks", "crossing_sub_axes", "crossing_names",
           "MAX_DEVICES"]

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
    topology : Topology, optional
        The node of each device (:class:`~mpiredist.core.topology.Topology`),
        for planning by where bytes go (:meth:`node_axes`); a mesh made by
        :meth:`hybrid` has one.  Not part of the mesh's equality: it says
        where the devices are, not which mesh this is.

    Examples
    --------
    >>> Mesh({"x": 2, "y": 4}).coords(5)
    (1, 1)
    >>> Mesh({"dp": 2, "tp": 4}, topology=Topology.uniform(2, 4)).node_axes()
    ('dp',)
    """

    __slots__ = ("_axes", "_comm", "_ranks", "_topology", "key")

    def __init__(self, axes, comm=None, ranks=None, topology=None):
        if isinstance(axes, Mesh):
            ranks = axes.ranks if ranks is None else ranks
            topology = axes.topology if topology is None else topology
        items = _parse_axes(axes)
        _validate(items)
        items = tuple((n, int(s)) for n, s in items)
        size = math.prod(s for _, s in items)
        object.__setattr__(self, "_axes", items)
        object.__setattr__(self, "_comm", comm)
        object.__setattr__(self, "_ranks", _parse_ranks(ranks, size))
        if topology is not None:
            if not isinstance(topology, Topology):
                raise MeshError(f"mesh topology must be a Topology, found "
                                f"{type(topology).__name__}")
            if topology.size != size:
                raise MeshError(f"topology {topology!r} has {topology.size} devices, but the "
                                f"mesh {','.join(f'{n}={v}' for n, v in items)} has {size}")
        object.__setattr__(self, "_topology", topology)
        # the value but its communicator as a plain tuple (hashed in C)
        object.__setattr__(self, "key", ("Mesh", items, self._ranks))

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

    @classmethod
    def hybrid(cls, within, across, comm=None, topology=None):
        """A mesh whose ``within`` axes stay inside nodes and ``across`` axes
        span them, as JAX's ``create_hybrid_device_mesh`` makes one.

        Its axes are ``across`` then ``within`` (major to minor), so a
        device's ``within`` digits are its place on its node: device
        ``n * W + j`` (W the product of the ``within`` sizes) is the j-th
        rank, in rank order, of node n (nodes in the order of their lowest
        rank).  ``topology``: the node of each rank of ``comm``, which
        :func:`mpiredist.topology` finds (collective: every rank calls it),
        e.g. ``Mesh.hybrid(within, across, topology=mr.topology())``; it may
        be left out when ``comm`` is a transport group, which knows its nodes
        (collective then).  MeshError unless there are as many nodes as the
        ``across`` axes make, each with W ranks.

        Examples
        --------
        >>> m = Mesh.hybrid({"tp": 2}, {"dp": 2}, topology=Topology([0, 1, 0, 1]))
        >>> m.ranks, m.node_axes()
        ((0, 2, 1, 3), ('dp',))
        """
        inner, outer = _parse_axes(within), _parse_axes(across)
        _validate(outer + inner)
        if topology is None:
            if not hasattr(comm, "nodes"):
                raise MeshError("Mesh.hybrid: give topology=mr.topology(comm), the node of "
                                "each rank (found collectively by the runtime)")
            topology = Topology(comm.nodes())
        if not isinstance(topology, Topology):
            raise MeshError(f"Mesh.hybrid: topology must be a Topology, found "
                            f"{type(topology).__name__}")
        w = math.prod(int(v) for _, v in inner)
        a = math.prod(int(v) for _, v in outer)
        nodes = topology.array()
        counts = np.bincount(nodes, minlength=topology.count)
        if topology.count != a or (counts != w).any():
            raise MeshError(
                f"Mesh.hybrid: within {dict(inner)} needs {w} rank(s) on each of {a} node(s) "
                f"(across {dict(outer)}), but the {topology.size} rank(s) are on "
                f"{topology.count} node(s) of {sorted(set(counts.tolist()))} rank(s)")
        ranks = tuple(int(r) for r in np.argsort(nodes, kind="stable"))
        ranks = None if ranks == tuple(range(len(ranks))) else ranks
        return cls(outer + inner, comm, ranks, Topology.uniform(a, w))

    @property
    def topology(self):
        """The node of each device (a :class:`Topology`), or None if not known.

        A mesh made by :meth:`hybrid`, or given ``topology=``, has one; the
        runtime finds a communicator's own when it plans a Transfer
        (:func:`mpiredist.runtime.groups.topology`, collective), since a
        property must not communicate.
        """
        return self._topology

    def with_topology(self, topology):
        """The same mesh with ``topology`` (a :class:`Topology`, or None)."""
        return Mesh(self._axes, self._comm, self._ranks, topology)

    def node_axes(self):
        """Names of the mesh's (sub-)axes whose digits change the node of some
        device, in mesh order: ``"dp"`` for a whole axis, ``"x:0"`` for one
        prime digit of one (:mod:`mpiredist.core.subaxes`).

        MeshError without a topology.
        """
        if self._topology is None:
            raise MeshError(f"mesh {self} has no topology: make it with Mesh.hybrid or "
                            "topology=, or plan with mpiredist.plan(..., topology=...)")
        return crossing_names(self._axes, self._topology)

    def abstract(self):
        """Return the same mesh without a communicator."""
        return Mesh(self._axes, None, self._ranks, self._topology)

    def with_comm(self, comm):
        """Return the same mesh bound to ``comm``."""
        return Mesh(self._axes, comm, self._ranks, self._topology)

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
        return hash(self.key)      # communicators are unhashable

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


def crossing_sub_axes(mesh_axes, topology):
    """The sub-axes of ``mesh_axes`` whose digit changes the node of some device
    under ``topology`` (a device's number is its mixed-radix digits over every
    sub-axis in mesh order)."""
    space = mesh_sub_axes(mesh_axes)
    nodes = topology.array()
    devices = np.arange(len(nodes), dtype=np.int64)
    out, stride = [], 1
    strides = {}
    for s in reversed(space):
        strides[s] = stride
        stride *= s.size
    for s in space:
        g = strides[s]
        base = devices[(devices // g) % s.size == 0]
        if any((nodes[base + j * g] != nodes[base]).any() for j in range(1, s.size)):
            out.append(s)
    return tuple(out)


def crossing_names(mesh_axes, topology):
    """:func:`crossing_sub_axes` as names: ``"dp"`` for a whole axis, ``"x:0"`` for a digit."""
    crossing = crossing_sub_axes(mesh_axes, topology)
    out = []
    for name, _ in mesh_axes:
        mine = tuple(s for s in crossing if s.name == name)
        if mine:
            out.extend(group_str(mine).split(","))
    return tuple(out)
