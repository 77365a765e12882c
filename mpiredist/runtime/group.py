"""TransferGroup: many arrays redistributed together, agreed once, in few collectives.

A model's weights or optimizer state are hundreds of arrays, most of them
small; one :class:`~mpiredist.Transfer` each costs an agreement and a few
collectives per array, and latency dominates.  A group agrees once for all
its items and moves them by the one exchange model
(:mod:`mpiredist.planning.pieces`: which rank sends which box of which item
to whom, partial sums included, on one mesh or between meshes): the pieces
of many items go in **one** ``Alltoallv`` of bytes per *bucket*, packed per
peer into one shared buffer.

Buckets are made from the items in order, from values alike on every rank:
an item joins the current bucket while what each rank sends and receives
for the bucket's items (from every rank's pieces) fits the pack room (W
less a margin); an item too large for the room moves alone through the
exchange engine in pipelined parts (:meth:`Exchange.run
<mpiredist.runtime.exchange.Exchange.run>`) in rings of half of W, and the
buckets then keep the other half.  A group of N items
that fit one bucket makes one collective, as one item does.  Items of the
same shape, dtype and layouts share their pieces (computed once).

Device arrays (CuPy, torch CUDA): the results are allocated on the device;
the bucket buffer is device memory where MPI is CUDA-aware (agreed once per
communicator, as for a Transfer), else host memory, packed from and
unpacked to the device, and an item alone then moves by an exchange staged
through host rings (made on its first such run).

Memory (this rank): the target blocks it allocates (sum of T_i), plus the
buckets' send and receive buffer (one, at most the pack room; kept between
runs, as a Transfer keeps its buffers, until :meth:`free`, with each
piece's typed view of it, made on the first run that uses that buffer),
plus the rings of an item alone while it moves (together with the buffer
within W), plus the Python objects of the pieces; the sources are read in
place.
That is within the bound sum_i max(S_i, T_i) + W, which the tests measure.

Partial sums combine on the receiving rank in a fixed order: the first
class of a box is copied, the others are added in the order (class, peer
offset), the same on every run and every replica.
"""

import math

import numpy as np

from ..core.backend import (array_module, bytes_as, copy_into, cupy_or_error, device_dtype,
                            combiner, on_device_of, synchronize)
from ..core.blocks import box_index, box_size, offsets
from ..core.errors import MpiredistError, PlanError, ShapeError
from ..planning import planner
from ..planning.budget import MARGIN, workspace_for
from ..planning.crossmesh import between
from ..planning.pieces import REDUCERS, Holders, layout_sources, layout_targets, recv_pieces
from ..planning.plans import format_bytes
from .agree import check_together, fingerprint
from .compile import target_of
from .context import Context, Keep
from .devices import staged_exchange
from .exchange import Exchange
from .groups import base_group, library_group, node_ranks
from .inputs import check_workspace
from .resources import Resources
from .run import Item, Job, KEPT, run

__all__ = ["TransferGroup"]

ALIGN = 16          # bytes: each piece starts at a multiple of this in a bucket buffer


class _Item:
    """One item's geometry on this rank: its Exchange (pieces, relative boxes)."""

    __slots__ = ("name", "shape", "dtype", "src", "dst", "exchange", "need", "bucket",
                 "source_shape", "target_shape", "order", "pieces")

    def __init__(self, name, shape, dtype, src, dst, exchange, need, pieces):
        self.name, self.shape, self.dtype, self.src, self.dst = name, shape, dtype, src, dst
        self.exchange, self.need, self.bucket = exchange, need, None
        self.pieces = pieces        # (sources, targets): for a staged exchange, if one runs
        self.source_shape, self.target_shape = exchange.source_shape, exchange.target_shape
        # receives in the order they are applied: first classes copied, then the
        # others added in key order (class, peer offset)
        self.order = sorted(exchange.recvs, key=lambda r: (r.combine, r.key))


def _entries(items):
    """``(names, specs, as_dict)`` of a list or dict of ``(shape, dtype, src, dst)``."""
    if isinstance(items, dict):
        return list(items), list(items.values()), True
    items = list(items)
    return list(range(len(items))), items, False


class TransferGroup(Job):
    """Redistribute many arrays together (collective; see the module doc).

    Parameters
    ----------
    items : list or dict
        ``(global_shape, dtype, src, dst)`` per item (layouts as
        :class:`~mpiredist.Layout` or text), in a list or a dict by name.
    mesh : Mesh
        The source layouts' mesh.
    dst_mesh : Mesh, optional
        The target layouts' mesh (default ``mesh``), on the same
        communicator: a weight sync from training ranks to inference ranks.
    workspace_bytes : int, optional
        W, the room of the bucket buffer and of the rings of items that
        move alone, half each when there are both (default: a quarter of the most
        that any rank holds of the group, the sum over items of
        max(S_i, T_i), plus 1 MiB: the single-array default applied to the
        group as a whole).

    Every rank of the communicator constructs the group with the same
    items; one agreement checks them all, and a bad item raises on every
    rank naming the item.  Then :meth:`run` with the blocks in the same form;
    a run goes through the one run path (:func:`mpiredist.runtime.run.run`)
    with every item an item of the job.
    """

    what = "TransferGroup.run"

    def __init__(self, items, mesh, dst_mesh=None, workspace_bytes=None):
        names, specs, self._as_dict = _entries(items)

        def body(mesh, rank):
            group = base_group(mesh)
            target = target_of(mesh, dst_mesh)
            mesh.check_ranks(group.size, "source")
            target.check_ranks(group.size, "target")
            parsed = [_parse(name, spec, mesh, target, group.size)
                      for name, spec in zip(names, specs)]
            w = check_workspace(workspace_bytes)
            return (target, parsed, w), dict(
                mesh=repr(mesh), dst_mesh=repr(target), workspace=w,
                items=fingerprint(*[(n, *p) for n, p in zip(names, parsed)]))

        mesh, (target, parsed, w) = check_together("TransferGroup", mesh, body)
        self._mesh, self._target_mesh = mesh, target
        base = base_group(mesh)
        self.group, self._lib = base, library_group(base)
        size = base.size
        self.every_holds = not between(mesh, dst_mesh, size)
        shapes = {}             # per distinct item: (sources, targets, pack need per rank)
        bounds = np.zeros(size, dtype=np.int64)     # sum of max(S_i, T_i) per rank
        for shape, dtype, src, dst in parsed:
            key = (shape, dtype, src, dst)
            if key not in shapes:
                sources = layout_sources(shape, mesh, src, size)
                targets = layout_targets(shape, target, dst, size,
                                         keep_classes=bool(dst.partial))
                shapes[key] = (sources, targets, _pack_need(sources, targets) * dtype.itemsize)
            sources, targets, _ = shapes[key]
            bounds += [max(_size(s), _size(t)) * dtype.itemsize for s, t in zip(sources, targets)]
        self._workspace = w = workspace_for(int(bounds.max(initial=0))) if w is None else w
        self._keep = Keep()
        self._bound = None
        (self._buckets, self._alone, self._room,
         self._alone_workspace) = _split_workspace([shapes[key][2] for key in parsed], w, size,
                                                   self._lib.count_limit)
        alone = {parsed[k] for k in self._alone}
        exchanges = {}
        self._items = []
        for name, key in zip(names, parsed):
            shape, dtype, src, dst = key
            if key not in exchanges:
                sources, targets, _ = shapes[key]
                # a bucketed item's exchange only gives its pieces; one alone moves by it
                exchanges[key] = Exchange(self._context(dtype), sources, targets,
                                          self._alone_workspace if key in alone
                                          else self._workspace, src.op)
            self._items.append(_Item(name, shape, dtype, src, dst, exchanges[key],
                                     shapes[key][2], shapes[key][:2]))
        for b, ks in enumerate(self._buckets):
            for k in ks:
                self._items[k].bucket = b
        self._layouts = []      # per bucket: its messages, made on the first run
        self._views = None      # per (bucket, device arrays): its pieces' views of it
        self.identity = dict(group=fingerprint(mesh, target, self._workspace,
                                               *[(i.name, i.shape, i.dtype, i.src, i.dst)
                                                 for i in self._items]))
        self.items = tuple(Item(i.source_shape, i.target_shape, i.dtype, i.name)
                           for i in self._items)
        self.name = (f"TransferGroup({len(self._items)} items, {self._mesh!r} -> "
                     f"{self._target_mesh!r}, workspace_bytes={self._workspace})")
        self._resources = Resources(node_ranks(base))
        self.calls = 0          # transport calls that moved data, over all runs

    # ------------------------------------------------------------ set-up

    def _context(self, dtype):
        return self._keep.get(("context", dtype), lambda: Context(self._lib, dtype))

    # ------------------------------------------------------------ public

    @property
    def names(self):
        """The items' names (dict keys, or list positions)."""
        return [i.name for i in self._items]

    @property
    def workspace_bytes(self):
        return self._workspace

    @property
    def kept_bytes(self):
        """Bytes this rank keeps between runs: the bucket buffer (within W), made
        on the first run, and the rings of items alone, released by :meth:`free`."""
        found = self._keep.get(("buffer",), lambda: None) if ("buffer",) in self._keep \
            else None
        rings = sum(v.ctx.kept_bytes for v in self._keep.values() if hasattr(v, "ctx"))
        contexts = sum(v.kept_bytes for v in self._keep.values() if isinstance(v, Context))
        return (0 if found is None else found.nbytes) + rings + contexts

    @property
    def buckets(self):
        """The number of buckets: one ``Alltoallv`` each per run."""
        return len(self._buckets)

    @property
    def source_shapes(self):
        """This rank's source block shape per item (None outside the source mesh)."""
        return self._form([i.source_shape for i in self._items])

    @property
    def target_shapes(self):
        """This rank's target block shape per item (None outside the target mesh)."""
        return self._form([i.target_shape for i in self._items])

    @property
    def bound(self):
        """This rank's memory bound: sum over items of max(S_i, T_i), plus W (bytes)."""
        if self._bound is None:             # worked out once: every run's memory check reads it
            total = 0
            for i in self._items:
                s, t = i.source_shape, i.target_shape
                sizes = [math.prod(x) * i.dtype.itemsize for x in (s, t) if x is not None]
                total += max(sizes + [0])
            self._bound = total + self._workspace
        return self._bound

    @property
    def bytes_sent(self):
        """Bytes this rank sends to other ranks per run (every item's)."""
        return sum(i.exchange.bytes_sent for i in self._items)

    def __len__(self):
        return len(self._items)

    def __repr__(self):
        return self.name

    def explain(self):
        """How the group runs: buckets, their collectives and bytes, items alone."""
        lines = [f"{self!r}: {len(self._buckets)} bucket(s) of one Alltoallv each, "
                 f"{len(self._alone)} item(s) alone in pipelined parts; pack room "
                 f"{format_bytes(self._room)}; bound on this rank {format_bytes(self.bound)}"]
        for b, ks in enumerate(self._buckets):
            sent = sum(self._items[k].exchange.bytes_sent for k in ks)
            lines.append(f"  bucket {b}: {len(ks)} item(s) ({_names(self._items, ks)}), "
                         f"this rank sends {format_bytes(sent)}, 1 Alltoallv")
        for k in self._alone:
            i = self._items[k]
            lines.append(f"  item {i.name!r} alone: packs up to "
                         f"{format_bytes(int(i.need.max()))} on a rank, exchange in parts "
                         f"within {format_bytes(self._alone_workspace)}, this rank sends "
                         f"{format_bytes(i.exchange.bytes_sent)}")
        return "\n".join(lines)

    def free(self):
        """Release what the group keeps between runs (local, no communication)."""
        if not self.freed:
            self.freed = True
            self._views = None
            self._keep.free()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def run(self, blocks, out=None):
        """Redistribute every item (collective); return the target blocks.

        ``blocks``: this rank's source block per item, in the form the items
        were given (a list, or a dict by name); None (or None per item) on a
        rank outside the source mesh.  ``out``: target blocks to fill, in the
        same form, or None.  Returns the target blocks in that form (None per
        item outside the target mesh), in the blocks' array library.  Every
        rank checks its blocks; one agreement raises on every rank, naming
        the first bad item, before any data moves.
        """
        error, listed, into = None, [None] * len(self._items), [None] * len(self._items)
        try:
            listed, into = self._listed(blocks, "blocks"), self._listed(out, "out")
        except (ValueError, MpiredistError) as exc:
            error = exc
        return self._form(run(self, listed, into, None, 0, error))

    def judge(self, natives, outs, extra):
        """The group's bound fits this rank's memory (MemoryBudgetError if not)."""
        self._resources.check(self.bound, self.group.rank, self.name)
        return KEPT

    def execute(self, natives, outs, kind, aware, flags, records, verdict):
        """Every item: the buckets, then the items alone (guarded by the run path)."""
        return self._move(natives, outs, kind, aware)

    # ------------------------------------------------------------ running

    def _listed(self, values, what):
        """``values`` as a list in item order; ShapeError for the wrong form."""
        rank = self.group.rank
        if values is None:
            return [None] * len(self._items)
        if self._as_dict:
            if not isinstance(values, dict):
                raise ShapeError(f"rank {rank}: the group's items are a dict; pass the {what} "
                                 "as a dict by name")
            known = set(self.names)
            extra = [k for k in values if k not in known]
            if extra:
                raise ShapeError(f"rank {rank}: {what} for unknown item(s) {extra[:4]}")
            return [values.get(i.name) for i in self._items]
        values = list(values)
        if len(values) != len(self._items):
            raise ShapeError(f"rank {rank}: {len(values)} {what} for a group of "
                             f"{len(self._items)} items")
        return values

    def _form(self, values):
        if self._as_dict:
            return {i.name: v for i, v in zip(self._items, values)}
        return list(values)

    def _move(self, natives, outs, kind, aware=False):
        """Every item: the buckets, then the items alone.  Device arrays: the
        results on the device; the bucket buffer there too when the transport
        takes device buffers (``aware``), else on the host, packed from and
        unpacked to the device, and the items alone staged through host rings."""
        xp = cupy_or_error() if kind.device else np
        targets = []
        for item, local, o in zip(self._items, natives, outs):
            shape = item.target_shape
            if o is None and shape is not None:
                o = xp.empty(shape, device_dtype(item.dtype) if kind.device else item.dtype)
            targets.append(o)
        for b in range(len(self._buckets)):
            self._bucket(b, natives, targets, kind.device, xp if aware else np)
        for k in self._alone:
            ex = self._staging(k) if kind.device and not aware else self._items[k].exchange
            before = ex.ctx.calls
            ex.run(natives[k], targets[k])
            self.calls += ex.ctx.calls - before
        return targets

    def _staging(self, k):
        """Item ``k``'s exchange with every part staged through host rings (made
        on its first staged run, kept until :meth:`free`)."""
        item = self._items[k]
        return self._keep.get(("staged", k), lambda: staged_exchange(
            self._lib, item.dtype, *item.pieces, self._alone_workspace, item.src.op))

    def _layout(self, ks):
        """A bucket's messages, worked out once: per piece sent ``(item, index,
        byte offset, dtype, shape)``, per piece received ``(item, index into
        the target, byte offset or None for this rank's own, index into the
        source, combine)`` in the order they apply, and the byte counts and
        displacements per peer."""
        n, me = self._lib.size, self._lib.rank
        sends, recvs = [[] for _ in range(n)], [[] for _ in range(n)]
        for k in ks:
            ex, size = self._items[k].exchange, self._items[k].dtype.itemsize
            for x in ex.sends:
                if x.peer != me:
                    sends[x.peer].append((k, x, _padded(math.prod(x.box[1]) * size)))
            for r in ex.recvs:
                if r.own is None:
                    recvs[r.peer].append((k, r, _padded(math.prod(r.box[1]) * size)))
        send_counts = [sum(x[2] for x in sends[p]) for p in range(n)]
        recv_counts = [sum(x[2] for x in recvs[p]) for p in range(n)]
        send_at, recv_at = offsets(send_counts), offsets(recv_counts)
        packs, offset = [], {}
        for p in range(n):
            at = send_at[p]
            for k, x, nbytes in sends[p]:
                packs.append((k, box_index(x.box), at, self._items[k].dtype, x.box[1]))
                at += nbytes
            at = recv_at[p]
            for k, r, nbytes in recvs[p]:
                offset[(k, r.key)] = at
                at += nbytes
        applies = []
        for k in ks:
            for r in self._items[k].order:
                applies.append((k, box_index(r.box), offset.get((k, r.key)),
                                None if r.own is None else box_index(r.own), r.combine,
                                r.box[1]))
        total = sum(send_counts)
        return packs, applies, (send_counts, send_at, recv_counts, recv_at, total,
                                total + sum(recv_counts))

    def _bucket(self, b, natives, targets, device=False, xp=np):
        """Every piece of bucket ``b``'s items in one ``alltoallv`` of bytes, through
        a buffer of library ``xp`` (the device's where the transport takes
        device buffers), from and to device arrays where ``device`` (whose
        bfloat16 items hold int16 bits: the views of the buffer are typed
        alike)."""
        if not self._layouts:
            self._layouts = [self._layout(ks) for ks in self._buckets]
        packs, applies, (send_counts, send_at, recv_counts, recv_at, split, size) = \
            self._layouts[b]
        buffer = self._keep.pop(("buffer",), None)
        if buffer is None or array_module(buffer) is not xp:
            # one buffer for every bucket, kept between runs (at most the pack
            # room, within W): a fresh one faulted its pages in on every run
            buffer = self._views = None
            buffer = xp.empty(max(x[2][5] for x in self._layouts), np.uint8)
            self._views = {}
        self._keep[("buffer",)] = buffer
        out, back = buffer[:split], buffer[split:size]
        typed = device_dtype if device else np.dtype
        if (b, device) not in self._views:
            # each piece's typed view of the buffer, made once per buffer (and
            # host or device arrays): a run then pays one index per piece on
            # each side, not four
            self._views[(b, device)] = (
                [bytes_as(out, at, typed(dtype), shape) for _, _, at, dtype, shape in packs],
                [None if at is None else bytes_as(back, at, typed(self._items[k].dtype), shape)
                 for k, _, at, _, _, shape in applies])
        slots, received = self._views[(b, device)]
        for (k, index, _, _, _), slot in zip(packs, slots):
            copy_into(slot, natives[k][index])      # host or device, either way
        synchronize(out)
        self.calls += 1
        self._lib.alltoallv(out, send_counts, back, recv_counts)
        for (k, index, _, own, combine, _), value in zip(applies, received):
            target = targets[k]
            if target is None:
                continue
            if own is not None:
                value = natives[k][own]
            view = target[index]
            if combine:
                item = self._items[k]      # device bfloat16: its bits
                combiner(REDUCERS[item.src.op], item.dtype, device)(
                    view, on_device_of(view, value), out=view)
            else:
                copy_into(view, value)
        synchronize(back)


def _parse(name, spec, mesh, target, size):
    """``(shape, dtype, src, dst)`` of one item, validated; errors name the item."""
    try:
        try:
            shape, dtype, src, dst = spec
        except (TypeError, ValueError):
            raise ShapeError(f"is {spec!r}, not a (shape, dtype, src, dst) tuple") from None
        shape, dt, _, s, _, d = planner.validate_sides(shape, dtype, mesh, src, target, dst,
                                                       size)
        if d.partial and (target != mesh or d.partial != s.partial or d.op != s.op):
            raise PlanError(f"target {d} keeps partial sums; a group keeps them only on one "
                            "mesh with the source's partial axes and op")
        return shape, dt, s, d
    except (ValueError, MpiredistError) as exc:
        raise type(exc)(f"item {name!r}: {exc}") from None


def _split_workspace(needs, w, size, limit):
    """``(buckets, alone, room, alone_workspace)`` for items of pack bytes per rank
    ``needs`` within W = ``w``: W holds the kept bucket buffer (``room``, less
    a margin for the pieces' Python objects); when items move alone, their
    rings take half of W beside the buffer, which keeps the other half, and
    all of it when no bucket is left."""
    margin = min(w // 4, MARGIN)
    room = max(0, w - margin)
    buckets, alone = _schedule(needs, room, size, limit)
    alone_workspace = w
    if alone:
        room = max(0, w - w // 2 - margin)
        buckets, alone = _schedule(needs, room, size, limit)
        alone_workspace = w // 2 if buckets else w
    return buckets, alone, (min(room, limit) if buckets else 0), alone_workspace


def _schedule(needs, room, size, limit):
    """``(buckets, alone)``: lists of item indices per bucket, and the items that
    move alone, from each item's pack bytes per rank (``needs``, alike on every
    rank: from every rank's pieces): a bucket's bytes on every rank within
    ``room`` and within MPI's count ``limit``."""
    buckets, alone, current = [], [], []
    room = min(room, limit)
    used = np.zeros(size, dtype=np.int64)
    for k, need in enumerate(needs):
        need = need + 2 * ALIGN * size             # each piece padded to ALIGN
        if (need > room).any():
            alone.append(k)
            continue
        if current and (used + need > room).any():
            buckets.append(current)
            current, used = [], np.zeros(size, dtype=np.int64)
        current.append(k)
        used += need
    if current:
        buckets.append(current)
    return buckets, alone


def _size(entry):
    return 0 if entry is None else box_size(entry.box)


def _pack_need(sources, targets):
    """Per rank, the elements it sends and receives (to and from other ranks) in
    the exchange from ``sources`` to ``targets``: what a bucket's buffer must
    hold for it there (alike on every rank: from every rank's pieces)."""
    holders = Holders(sources)
    sent = np.zeros(len(targets), dtype=np.int64)
    received = np.zeros(len(targets), dtype=np.int64)
    for q in range(len(targets)):
        for x in recv_pieces(q, sources, targets, holders):
            if x.peer != q:
                n = box_size(x.box)
                received[q] += n
                sent[x.peer] += n
    return sent + received


def _padded(nbytes):
    return -(-nbytes // ALIGN) * ALIGN



def _names(items, ks):
    shown = ", ".join(repr(items[k].name) for k in ks[:4])
    return shown + (", ..." if len(ks) > 4 else "")
