"""Bytes by where they go: the part of each step that crosses nodes (pure).

With a :class:`~mpiredist.core.topology.Topology` (the node of each device),
a step's *across-node bytes per rank* are the most bytes that leave or enter
one node, over the node's number of ranks (:func:`node_share`): the ranks of
a node share its link, so this is what the step costs the link in a rank's
terms (a profile's across-node rates are measured with every rank of a node
sending at once).  Bytes are counted by
the direct algorithm the byte conventions of
docs/semantics.md stand for: an all-gather sends a member's block to every
other member; an all-to-all and a reduce-scatter send each member the part
of the block it keeps (``before(d) & after(m)``); an all-reduce reduces
slices (each member gets its slice of every other's block) and gathers them
(each member sends its reduced slice to every other); a permute sends the
block to its partner; an exchange sends the pieces of the piece model
(:mod:`mpiredist.planning.pieces`).  The lower bound is, per node, what
of its devices' target blocks no device of the node holds (for partial sums
that are reduced, unless every class is on the node), shared by its
devices: the busiest device of any plan moves at least that across nodes.

Everything is a numpy computation over the devices (``P`` of them) and, for
all-to-alls, reduce-scatters and all-reduces, over the members of a group:
exact up to ``EXACT_PAIRS`` (device, member) pairs; past it a member's part
is taken as an even share of the block (exact where lengths divide).
Exchanges are exact up to ``EXACT_EXCHANGE`` devices (past it: every byte
counted as crossing), the lower bound up to ``EXACT_BOUND`` (past it: None).
"""

import math
from functools import lru_cache

import numpy as np

from ..core.blocks import block_index, rank_block, slab_interval
from ..core.mesh import Mesh
from ..core.subaxes import group_size, mesh_sub_axes, rank_digits
from .pieces import Holders, layout_sources, layout_targets, send_pieces

__all__ = ["Move", "step_across_bytes", "across_lower_bound", "node_share", "EXACT_PAIRS",
           "EXACT_EXCHANGE", "EXACT_BOUND"]

EXACT_PAIRS = 1 << 24
EXACT_EXCHANGE = 256
EXACT_BOUND = 4096


class _Devices:
    """Every device of a mesh as numbers, with its node and its digits."""

    def __init__(self, mesh_axes, topology):
        self.space = mesh_sub_axes(mesh_axes)
        self.size = math.prod(s for _, s in mesh_axes)
        self.all = np.arange(self.size, dtype=np.int64)
        self.nodes = topology.array()
        self.strides, stride = {}, 1
        for s in reversed(self.space):
            self.strides[s] = stride
            stride *= s.size

    def volumes(self, shape, layout, devices=None):
        """Elements of each device's block of ``layout``."""
        devices = self.all if devices is None else devices
        vol = np.ones(len(devices), dtype=np.int64)
        for n, group in zip(shape, layout.dims):
            lo, hi = slab_interval(n, group, self.space, devices)
            vol *= hi - lo
        return vol

    def boxes(self, shape, layout, devices=None):
        """``[(starts, stops)]`` per dim of each device's block of ``layout``."""
        devices = self.all if devices is None else devices
        return [slab_interval(n, group, self.space, devices)
                for n, group in zip(shape, layout.dims)]

    def base(self, group):
        """Each device with the digits of ``group`` set to 0 (its group's first member)."""
        out = self.all.copy()
        for s in group:
            out -= (self.all // self.strides[s] % s.size) * self.strides[s]
        return out

    def member(self, group, base, c):
        """Member ``c`` (mixed radix over ``group``) of each group of ``base``."""
        out = base.copy()
        for s in reversed(group):
            c, digit = divmod(c, s.size)
            out += digit * self.strides[s]
        return out

    def digit(self, s, devices=None):
        """Digit of sub-axis ``s`` of each device."""
        devices = self.all if devices is None else devices
        return devices // self.strides[s] % s.size

    def index(self, group):
        """Mixed-radix index over ``group`` of each device (first sub-axis major)."""
        out = np.zeros(self.size, dtype=np.int64)
        for s in group:
            out = out * s.size + self.digit(s)
        return out

    def permute_dest(self, before, after):
        """The device that receives each device's ``before`` block in a permute
        (:func:`mpiredist.planning.routing.permute_dest`, for every device at once):
        its ``after`` block is that block, the digits neither layout fixes kept."""
        used_b, used_a = after.used(), before.used()          # the receiver's view
        free_b = [s for s in self.space if s not in used_b and s in used_a]
        free_a = [s for s in self.space if s not in used_a and s in used_b]
        digits = {s: self.digit(s) for s in self.space}
        out = dict(digits)
        for group_b, group_a in zip(after.dims, before.dims):
            p = self.index(group_a)
            for s in reversed(group_b):
                p, out[s] = np.divmod(p, s.size)
        q = self.index(free_a)
        for s in reversed(free_b):
            q, out[s] = np.divmod(q, s.size)
        return sum(out[s] * self.strides[s] for s in self.space)

    def others(self, group):
        """Members of each device's group on other nodes than the device's."""
        key = self.base(group) * (int(self.nodes.max()) + 1) + self.nodes
        _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        return group_size(group) - counts[inverse]


def node_share(sent, received, nodes):
    """The most that leaves or enters one node, over that node's devices (rounded
    up): ``sent`` and ``received`` per device, ``nodes`` the node of each."""
    nodes = np.asarray(nodes)
    count = int(nodes.max()) + 1 if len(nodes) else 0
    ranks = np.bincount(nodes, minlength=count)
    most = 0
    for per in (sent, received):
        total = np.zeros(count, dtype=np.int64)
        np.add.at(total, nodes, np.asarray(per, dtype=np.int64))
        most = max(most, int(np.max(-(-total // np.maximum(ranks, 1)), initial=0)))
    return most


def _overlap(a, b):
    """Elements of the overlaps of per-dim box arrays ``a`` and ``b``."""
    vol = 1
    for (a0, a1), (b0, b1) in zip(a, b):
        vol = vol * np.maximum(np.minimum(a1, b1) - np.maximum(a0, b0), 0)
    return vol


class Move:
    """What the functions here need of a step (a :class:`~mpiredist.planning.plans.Step`
    will do): ``op``, ``axes``, ``before``, ``after``, ``group_size`` and its
    ``bytes_sent_per_rank``."""

    __slots__ = ("op", "axes", "before", "after", "group_size", "bytes_sent_per_rank")

    def __init__(self, op, axes, before, after, bytes_sent_per_rank):
        self.op, self.axes, self.before, self.after = op, tuple(axes), before, after
        self.group_size = group_size(self.axes)
        self.bytes_sent_per_rank = bytes_sent_per_rank


def step_across_bytes(shape, itemsize, step, mesh_axes, topology):
    """The most bytes any device sends to, or receives from, devices on other
    nodes in ``step`` (a Step or a :class:`Move`)."""
    if step.op == "slice" or topology.count == 1 or not step.bytes_sent_per_rank:
        return 0
    return _across(tuple(shape), itemsize, step.op, tuple(step.axes), step.before, step.after,
                   step.bytes_sent_per_rank, tuple(mesh_axes), topology)


@lru_cache(maxsize=1024)            # the planner prices the same moves in many candidates
def _across(shape, itemsize, op, axes, before, after, sent, mesh_axes, topology):
    step = Move(op, axes, before, after, sent)
    dev = _Devices(mesh_axes, topology)
    if step.op == "all_gather":
        sent, got = _gathered(dev, shape, step)
    elif step.op in ("all_to_all", "reduce_scatter"):
        sent, got = _parts(dev, shape, step)
    elif step.op == "all_reduce":
        sent = got = _slices(dev, shape, step)             # symmetric
    elif step.op == "permute":
        sent, got = _permuted(dev, shape, step, mesh_axes)
    else:
        return _exchanged(dev, shape, itemsize, step, mesh_axes)
    return node_share(sent * itemsize, got * itemsize, dev.nodes)


def _gathered(dev, shape, step):
    """All-gather: each member's block goes to every other member."""
    vol = dev.volumes(shape, step.before)
    g = step.group_size
    if g * dev.size > EXACT_PAIRS:
        return vol * dev.others(step.axes), vol * dev.others(step.axes)
    base = dev.base(step.axes)
    got = np.zeros(dev.size, dtype=np.int64)
    for c in range(g):
        m = dev.member(step.axes, base, c)
        got += np.where(dev.nodes[m] != dev.nodes, vol[m], 0)
    return vol * dev.others(step.axes), got


def _parts(dev, shape, step):
    """All-to-all / reduce-scatter: member m gets ``before(d) & after(m)``."""
    g = step.group_size
    if g * dev.size > EXACT_PAIRS:                  # an even share per member
        even = dev.volumes(shape, step.before) // g * dev.others(step.axes)
        return even, even
    base = dev.base(step.axes)
    before, after = dev.boxes(shape, step.before), dev.boxes(shape, step.after)
    sent = np.zeros(dev.size, dtype=np.int64)
    got = np.zeros(dev.size, dtype=np.int64)
    for c in range(g):
        m = dev.member(step.axes, base, c)
        away = dev.nodes[m] != dev.nodes
        sent += np.where(away, _overlap(before, dev.boxes(shape, step.after, m)), 0)
        got += np.where(away, _overlap(dev.boxes(shape, step.before, m), after), 0)
    return sent, got


def _slices(dev, shape, step):
    """All-reduce by slices: member m reduces slice m of the flat block."""
    g = step.group_size
    n = dev.volumes(shape, step.before)
    others = dev.others(step.axes)
    if g * dev.size > EXACT_PAIRS:
        return 2 * (n // g) * others
    base = dev.base(step.axes)
    me = np.zeros(dev.size, dtype=np.int64)
    sent = np.zeros(dev.size, dtype=np.int64)
    for c in range(g):
        m = dev.member(step.axes, base, c)
        part = (c + 1) * n // g - c * n // g
        sent += np.where(dev.nodes[m] != dev.nodes, part, 0)        # reduce: slice c to m
        me = np.where(m == dev.all, part, me)
    return sent + me * others                                        # gather: my slice out


def _permuted(dev, shape, step, mesh_axes):
    vol = dev.volumes(shape, step.before)
    dest = dev.permute_dest(step.before, step.after)
    away = dev.nodes[dest] != dev.nodes
    got = np.zeros(dev.size, dtype=np.int64)
    np.add.at(got, dest, np.where(away, vol, 0))
    return np.where(away, vol, 0), got


def _exchanged(dev, shape, itemsize, step, mesh_axes):
    if dev.size > EXACT_EXCHANGE:
        return step.bytes_sent_per_rank
    mesh = Mesh(mesh_axes)
    sources = layout_sources(shape, mesh, step.before, dev.size)
    targets = layout_targets(shape, mesh, step.after, dev.size, keep_classes=True)
    holders = Holders(sources)
    sent = np.zeros(dev.size, dtype=np.int64)
    got = np.zeros(dev.size, dtype=np.int64)
    for p in range(dev.size):
        for x in send_pieces(p, sources, targets, holders):
            if dev.nodes[x.peer] != dev.nodes[p]:
                n = math.prod(hi - lo for lo, hi in x.box)
                sent[p] += n
                got[x.peer] += n
    return node_share(sent * itemsize, got * itemsize, dev.nodes)


def across_lower_bound(shape, itemsize, src, dst, mesh_axes, topology):
    """Bytes per rank that must cross nodes whatever the plan (None past
    ``EXACT_BOUND`` devices).

    Node n needs the distinct target blocks of its devices; an element of
    one comes from another node unless n holds it -- where partial sums are
    reduced, unless n holds every source class that contributes to it (the
    classes over the partial axes the target keeps must match).  Data may
    enter a node through any of its devices, so the bound is the most over
    nodes of what a node lacks, shared by its devices: the busiest device
    of a plan receives at least that from other nodes.
    """
    dev = _Devices(mesh_axes, topology)
    if topology.count == 1:
        return 0
    if dev.size > EXACT_BOUND:
        return None
    mesh = Mesh(mesh_axes)
    sources = layout_sources(shape, mesh, src, dev.size)
    kept = [block_index(dst.partial, rank_digits(mesh, d)) for d in range(dev.size)]
    needed = {}                                 # (block, kept class) -> source classes
    for r, s in enumerate(sources):
        needed.setdefault((s.block, kept[r]), set()).add(s.cls)
    holders = Holders(sources)
    blocks = list(holders.blocks)
    los = np.array([[lo for lo, _ in holders.box[b]] for b in blocks], dtype=np.int64)
    his = np.array([[hi for _, hi in holders.box[b]] for b in blocks], dtype=np.int64)
    most = 0
    for node in range(topology.count):
        here = np.flatnonzero(dev.nodes == node).tolist()
        held = {(sources[r].block, sources[r].cls) for r in here}
        wanted = {(rank_block(tuple(shape), dst, rank_digits(mesh, d)), kept[d]) for d in here}
        lacking = 0
        for box, k in wanted:
            need = math.prod(hi - lo for lo, hi in box)
            if not need:
                continue
            present = np.array([bool(needed.get((b, k))) and
                                all((b, c) in held for c in needed[(b, k)]) for b in blocks])
            if box:
                lo = np.array([lo for lo, _ in box], dtype=np.int64)
                hi = np.array([hi for _, hi in box], dtype=np.int64)
                inter = np.prod(np.maximum(np.minimum(his, hi) - np.maximum(los, lo), 0), axis=1)
            else:
                inter = np.ones(len(blocks), dtype=np.int64)
            lacking += need - int(np.sum(inter[present]))
        most = max(most, -(-lacking * itemsize // len(here)))
    return most
