"""Plans between two meshes (pure): one refined mesh, or an exchange in rounds.

Two meshes over the same ranks in the same order whose axis boundaries nest
(``x=8`` against ``a=2,b=4``: each axis is a run of prime digits of the rank)
are both sub-axes of one *refined* mesh: :func:`refine` gives it, with each
original axis as a run of its axes, so a layout on either mesh is a layout on
the refined one and the collective normal form (and its memory theorem)
applies unchanged.  Otherwise the array moves by one exchange of the piece
model (:mod:`mpiredist.planning.pieces`), and :class:`CrossPlan` describes it.
"""

import math
from dataclasses import dataclass

from ..core.blocks import box_size, overlap
from ..core.errors import LayoutError, MeshError
from ..core.layout import Layout
from ..core.mesh import Mesh
from .pieces import (Holders, exchange_workspace, layout_boxes, layout_sources, layout_targets,
                     part_limit, parts, recv_pieces, send_pieces)

__all__ = ["between", "refine", "rewrite", "route", "comm_size_of", "relabel", "CrossPlan",
           "cross_plan"]


def between(mesh, dst_mesh, comm_size=None):
    """True if a redistribution from ``mesh`` to ``dst_mesh`` takes the
    between-meshes path (the one decision of every route): a target mesh that
    differs, or, given the size of the communicator, a mesh over only some of
    its ranks (a mesh over all of them in another order runs on one mesh).
    A plan (``comm_size`` None) is over devices, whatever their ranks.

    Never raises: a malformed argument takes that path, whose validation
    then raises on every rank.
    """
    try:
        mesh = mesh if isinstance(mesh, Mesh) else Mesh(mesh)
        if dst_mesh is not None:
            dst_mesh = dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh)
            if dst_mesh != mesh:
                return True
        if comm_size is None or mesh.ranks is None:
            return False
        return mesh.auto or sorted(mesh.device_ranks()) != list(range(comm_size))
    except (ValueError, TypeError):
        return True


def _cuts(mesh):
    """Place values at the axis boundaries: 1, last size, ..., mesh size."""
    out, v = [1], 1
    for s in reversed(mesh.sizes):
        v *= s
        out.append(v)
    return out


def refine(a, b):
    """``(refined mesh, {axis: refined axes} of a, ... of b)``, or None.

    None unless both meshes have the same number of devices, the same rank
    list, and boundaries that nest (each divides the next).
    """
    if a.size != b.size or a.device_ranks() != b.device_ranks():
        return None
    cuts = sorted(set(_cuts(a)) | set(_cuts(b)))
    if any(hi % lo for lo, hi in zip(cuts, cuts[1:])):
        return None
    names = {c: f"_r{i}" for i, c in enumerate(reversed(cuts[:-1]))}   # major first
    axes = tuple((names[lo], hi // lo) for lo, hi in reversed(list(zip(cuts, cuts[1:]))))
    refined = Mesh(axes, a.comm)          # both are every rank, in order
    return refined, _runs(a, cuts, names), _runs(b, cuts, names)


def _runs(mesh, cuts, names):
    out, v = {}, 1
    for name, size in reversed(mesh.axes):
        inside = [c for c in cuts if v <= c < v * size]
        out[name] = tuple(names[c] for c in reversed(inside))
        v *= size
    return out


def rewrite(layout, runs):
    """``layout`` with every mesh axis replaced by its run of refined axes."""
    layout = Layout.parse(layout)
    dims = tuple(tuple(r for a in d for r in runs[a]) for d in layout.dims)
    return Layout(dims, tuple(r for a in layout.partial for r in runs[a]), layout.op)


def route(mesh, src, dst_mesh, dst, comm_size):
    """``(refined mesh, src, dst)`` rewritten onto it, or None for an exchange (pure).

    LayoutError for a partial target that only the exchange could reach
    (the exchange does not make partial sums).
    """
    whole = mesh.is_whole(comm_size) and dst_mesh.is_whole(comm_size)
    found = refine(mesh, dst_mesh) if whole else None
    if found is None:
        if dst.partial:
            raise LayoutError(f"target layout {dst} has partial axes; between meshes whose "
                              "rank orders do not nest the target must be reduced")
        return None
    refined, runs_a, runs_b = found
    return refined, rewrite(src, runs_a), rewrite(dst, runs_b)


def comm_size_of(*meshes):
    """Ranks a communicator needs for ``meshes``: enough for every listed rank."""
    return max(max(m.device_ranks()) + 1 if m.size else 0 for m in meshes)


def relabel(shape, src_mesh, src, dst_mesh, dst, comm_size, topology=None):
    """``dst_mesh`` (``ranks="auto"``) with its ranks chosen: every rank, ordered
    to leave the most of each target block where it already is.

    Greedy over the (device, rank) pairs by the elements the rank's source
    block shares with the device's target block, largest first (ties by
    device, then rank); devices left over take the ranks left over in
    order.  The plain order ``0..P-1`` is kept unless this keeps more in
    place.  From shapes and layouts alone: every rank chooses alike.

    ``topology``: the node of each rank of the communicator (a
    :class:`~mpiredist.core.topology.Topology` of ``comm_size``).  On more
    than one node the devices are first given nodes, greedily by the
    elements of their target block that the node's ranks hold, as many
    devices as the node has ranks; then ranks inside each node as above.
    The plain order is kept unless this moves fewer elements across nodes
    (or as few, and keeps more in place).
    """
    if dst_mesh.size != comm_size:
        raise MeshError(f"target mesh {dst_mesh}: ranks='auto' orders every rank, but the "
                        f"mesh has {dst_mesh.size} devices and the communicator "
                        f"{comm_size} ranks")
    if topology is not None and topology.size != comm_size:
        raise MeshError(f"topology {topology!r} has {topology.size} ranks, but the "
                        f"communicator {comm_size}")
    sboxes = layout_boxes(shape, src_mesh, src, comm_size)
    tboxes = layout_boxes(shape, Mesh(dst_mesh.axes), dst, comm_size)
    kept = {}                                   # (device, rank) -> elements in place
    for d, tb in enumerate(tboxes):
        for r, sb in enumerate(sboxes):
            common = None if sb is None else (overlap(sb, tb) if tb else ())
            n = 0 if common is None else box_size(common)
            if n:
                kept[d, r] = n
    if topology is None or topology.count == 1:
        ranks = _assign(range(comm_size), range(comm_size), kept)
        plain = list(range(comm_size))
        if _in_place(ranks, kept) <= _in_place(plain, kept):
            ranks = plain                       # never worse than the plain order
        return Mesh(dst_mesh.axes, dst_mesh.comm, ranks)
    nodes = topology.array().tolist()
    held = _held_on_nodes(sboxes, tboxes, nodes, topology.count)
    places = [nodes.count(n) for n in range(topology.count)]
    on = {}                                     # device -> node
    for _, d, n in sorted((-held[d][n], d, n) for d in range(comm_size)
                          for n in range(topology.count) if held[d][n]):
        if d not in on and places[n]:
            on[d] = n
            places[n] -= 1
    for d in range(comm_size):                  # devices no node holds a part of
        if d not in on:
            n = next(k for k in range(topology.count) if places[k])
            on[d], places[n] = n, places[n] - 1
    ranks = [None] * comm_size
    for n in range(topology.count):
        devices = [d for d in range(comm_size) if on[d] == n]
        mine = [r for r in range(comm_size) if nodes[r] == n]
        for d, r in zip(devices, _assign(devices, mine, kept)):
            ranks[d] = r
    plain = list(range(comm_size))

    def score(order):
        across = sum(box_size(tb) - held[d][nodes[r]] for d, (tb, r) in
                     enumerate(zip(tboxes, order)) if tb is not None)
        return across, -_in_place(order, kept)
    if score(ranks) >= score(plain):
        ranks = plain
    return Mesh(dst_mesh.axes, dst_mesh.comm, ranks)


def _assign(devices, ranks, kept):
    """The rank of each of ``devices`` (in order), from ``ranks``: greedy by the
    elements in place, largest first; the rest in order."""
    ranks = list(ranks)
    mine = set(ranks)
    pairs = sorted((-n, d, r) for (d, r), n in kept.items() if r in mine)
    wanted = set(devices)
    chosen, taken = {}, set()
    for _, d, r in pairs:
        if d in wanted and d not in chosen and r not in taken:
            chosen[d] = r
            taken.add(r)
    rest = iter(r for r in ranks if r not in taken)
    return [chosen[d] if d in chosen else next(rest) for d in devices]


def _in_place(order, kept):
    return sum(kept.get((d, r), 0) for d, r in enumerate(order))


def _held_on_nodes(sboxes, tboxes, nodes, count):
    """``held[d][n]``: elements of device d's target block that node n's ranks hold
    (distinct source boxes: a replicated block counts once)."""
    on_node = [set() for _ in range(count)]
    for r, sb in enumerate(sboxes):
        if sb is not None:
            on_node[nodes[r]].add(sb)
    held = []
    for tb in tboxes:
        row = []
        for boxes in on_node:
            n = 0
            if tb is not None:
                for sb in boxes:
                    common = overlap(sb, tb) if tb else ()
                    n += 0 if common is None else box_size(common)
            row.append(n)
        held.append(row)
    return held


@dataclass(frozen=True)
class CrossPlan:
    """An exchange between two meshes: what moves, in how many parts.

    Figures are over all ranks of the communicator (``comm_size``), for the
    workspace W.  ``bytes_sent_max`` and ``bytes_received_max`` are the most
    any rank sends or receives from other ranks; ``bytes_total`` is the sum;
    ``peers`` the most other ranks one rank sends to or receives from;
    ``part_items`` the elements of a packed part (W / 4 of bytes) and
    ``parts`` the most parts one rank sends or receives.
    """

    global_shape: tuple
    dtype: object
    src_mesh: Mesh
    src: Layout
    dst_mesh: Mesh
    dst: Layout
    comm_size: int
    workspace: int
    bytes_total: int
    bytes_sent_max: int
    bytes_received_max: int
    peers: int
    part_items: int
    parts: int

    def to_dict(self):
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(global_shape=list(self.global_shape), dtype=str(self.dtype),
                 src_mesh=str(self.src_mesh), dst_mesh=str(self.dst_mesh),
                 src=str(self.src), dst=str(self.dst), kind="exchange between meshes")
        return d

    def to_json(self, **kwargs):
        import json
        return json.dumps(self.to_dict(), **kwargs)

    def explain(self):
        from .plans import format_bytes
        return "\n".join([
            f"Exchange {self.src} on mesh {self.src_mesh} -> {self.dst} on mesh "
            f"{self.dst_mesh}: {list(self.global_shape)} {self.dtype}, "
            f"{self.comm_size} ranks, W = {format_bytes(self.workspace)}",
            f"  sends {format_bytes(self.bytes_total)} in all; at most {format_bytes(self.bytes_sent_max)}"
            f" sent and {format_bytes(self.bytes_received_max)} received by one rank",
            f"  point-to-point messages, pipelined: at most {self.peers} peer(s) and "
            f"{self.parts} part(s) per rank, packed parts of {self.part_items} item(s)",
            "  memory: target block + W on every rank (S = 0 off the source mesh, "
            "T = 0 off the target mesh)"])

    def __str__(self):
        return self.explain()


def cross_plan(shape, dtype, src_mesh, src, dst_mesh, dst, comm_size, workspace=None):
    """The :class:`CrossPlan` of an exchange (every rank's pieces: O(ranks^2) work)."""
    itemsize = dtype.itemsize
    sources = layout_sources(shape, src_mesh, src, comm_size)
    targets = layout_targets(shape, dst_mesh, dst, comm_size)
    if workspace is None:
        workspace = exchange_workspace(sources, targets, itemsize)
    holders = Holders(sources)
    items = part_limit(itemsize, workspace, (True, True))     # as the runtime cuts
    items = max(1, workspace // 2 // itemsize) if items == math.inf else items
    sent, received, peers, most = [], [], 1, 0
    for r in range(comm_size):
        out = [x for x in send_pieces(r, sources, targets, holders) if x.peer != r]
        into = [x for x in recv_pieces(r, sources, targets, holders) if x.peer != r]
        sent.append(sum(box_size(x.box) for x in out) * itemsize)
        received.append(sum(box_size(x.box) for x in into) * itemsize)
        peers = max(peers, len({x.peer for x in out}), len({x.peer for x in into}))
        for pieces in (out, into):
            most = max(most, sum(1 if x.direct else len(parts(_shape(x.box), items))
                                 for x in pieces))
    return CrossPlan(tuple(shape), dtype, src_mesh, Layout.parse(src), dst_mesh,
                     Layout.parse(dst), comm_size, workspace, sum(sent), max(sent + [0]),
                     max(received + [0]), peers, items, most)


def _shape(box):
    return tuple(hi - lo for lo, hi in box)
