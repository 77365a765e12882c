"""``mr.save`` and ``mr.load``: a state from any mesh, to any mesh and rank count.

    mr.save("run/ckpt", {"model": {"w": w, "b": b}, "step": 100})      # collective
    out = mr.load("run/ckpt", {"model": {"w": (mesh, "[{}, {x}]"),       # a new DistArray
                                         "b": b}, "step": None})        # b filled in place

A save writes each rank's share of its blocks into its own file of a new
generation directory, in parallel; rank 0 then writes the index and
replaces the pointer, so the checkpoint appears at once, complete and on
disk (docs/checkpoint-format.md).  A load reads on each rank only the byte
ranges of the saved boxes that overlap its target blocks, verifying every
tile's checksum.  Errors found before anything moves (bad arguments, a
missing name, another shape or dtype, a truncated file, an unknown format)
raise on every rank before any byte is written; see
:mod:`mpiredist.checkpoint.collective` for the collectives each runs.
"""

import json
import math
import os
import re

import numpy as np

from ..arrays.base import device_of
from ..arrays.distarray import DistArray
from ..core.backend import dtype_text
from ..core.blocks import box_shape, box_size, rank_block
from ..core.errors import CheckpointError, MpiredistError, ShapeError
from ..core.layout import Layout
from ..core.subaxes import expand, rank_digits
from . import collective, dcp
from .entries import entry, flatten, json_value, share, unflatten
from .grid import grid
from .index import POINTER, generation_name, index_document, read_pointer
from .plan import Target
from .reader import fill
from .store import prepared, read_any
from .writer import Box, publish, remove_generation, write_boxes

__all__ = ["save", "load", "workspace"]

_MIB = 1 << 20
BUFFER_MAX = 64 * _MIB      # largest read or write buffer


def workspace(nbytes, given):
    """W of a save or load whose blocks on this rank take ``nbytes``: ``given``, or
    ``nbytes / 4 + 1 MiB`` (as a redistribution's default)."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 0:
            raise ShapeError(f"workspace_bytes={given!r} is not a non-negative integer")
        return given
    return nbytes // 4 + _MIB


def _buffer(w):
    """The I/O buffer within W: a quarter of it (the rest for the index, the plan's
    objects and the allocator's slack: at W/2 a load from DCP's metadata of 1936
    chunks grew the resident set by 1.1 W)."""
    return max(64 << 10, min(BUFFER_MAX, w // 4))


def _call(verb, path, tree):
    """``(what, pairs, group, early)``: the call's name, its flattened leaves,
    the group it runs on, and the error that flattening raised (``None``),
    kept to raise on every rank inside the first agreement."""
    what = f"{verb}({os.fspath(path)!r})" if isinstance(path, (str, os.PathLike)) else verb
    try:
        pairs = flatten(tree, what)
        return what, pairs, _comm_of(pairs), None
    except (ValueError, MpiredistError) as exc:
        return what, [], collective.world(), exc


def _comm_of(pairs):
    for _, leaf in pairs:
        mesh = getattr(leaf, "mesh", None)
        if isinstance(leaf, tuple) and len(leaf) == 2:
            mesh = leaf[0]
        if mesh is not None and hasattr(mesh, "axes") and hasattr(mesh, "comm"):
            return collective.communicator(mesh)
    return collective.world()


def _check_comms(entries, comm):
    for e in entries:
        if e.mesh is not None and collective.communicator(e.mesh) != comm:
            raise ShapeError(f"array {e.name!r}: its mesh {e.mesh} runs on another "
                             "communicator than the call's; one save or load uses one")


def _names(entries, what):
    seen = {}
    for e in entries:
        if e.name in seen:
            raise CheckpointError(f"{what}: keys {seen[e.name]} and {e.key} both name "
                                  f"{e.name!r}")
        seen[e.name] = e.key


def _next_generation(path):
    """The generation a save at ``path`` writes: one past any there."""
    if os.path.isfile(path):
        raise CheckpointError(f"{path!r} is a file; a checkpoint is a directory")
    if not os.path.isdir(path):
        return generation_name(1)
    entries = os.listdir(path)
    numbers = [int(m.group(1)) for m in (re.fullmatch(r"gen-(\d+)", n) for n in entries) if m]
    if POINTER in entries:
        current = read_pointer(path)
        m = re.fullmatch(r"gen-(\d+)", current)
        numbers.append(int(m.group(1)) if m else 0)
    elif [n for n in entries if not n.startswith("gen-")]:
        raise CheckpointError(f"{path!r} is a directory that is not an mpiredist checkpoint "
                              f"(no {POINTER}); refusing to write into it")
    return generation_name(max(numbers, default=0) + 1)


def _reduced(e, rank, size):
    """An entry whose partial sums are reduced (a collective redistribution)."""
    if e.kind == "dist" and e.layout.partial:
        dims = [list(axes) for axes in e.layout.dims]
        if dims:
            shards = [math.prod(e.mesh.axis_size(a) for a in axes) for axes in dims]
            d = max(range(len(dims)), key=lambda d: (-(-e.shape[d] // shards[d]), -d))
            dims[d] += list(e.layout.partial)
        obj = e.obj.redistribute(Layout(dims))
        return entry(e.key, obj, rank, size)
    if e.kind == "dtensor" and any(type(p).__name__ in ("Partial", "_Partial")
                                   for p in e.obj.placements):
        from torch.distributed.tensor import Replicate

        from ..arrays import dtensor
        placements = [Replicate() if type(p).__name__ in ("Partial", "_Partial") else p
                      for p in e.obj.placements]
        obj = dtensor.redistribute(e.obj, placements)
        return entry(e.key, obj, rank, size)
    return e


def save(path, state, *, workspace_bytes=None):
    """Save ``state`` to the directory ``path`` (collective).

    Parameters
    ----------
    path : str or os.PathLike
        A directory on a file system every rank sees; made if missing.  An
        earlier checkpoint there is replaced once this one is complete (and
        stays loadable if this save fails or is killed).
    state : dict
        Names to DistArrays, DTensors, numpy arrays or torch tensors (the
        last two taken as replicated: the same on every rank) and small
        values (numbers, text, lists of them); nested dicts allowed.
        Partial sums are reduced first (a redistribution within its bound).
    workspace_bytes : int, optional
        W: the write buffer is a quarter of it (default: a quarter of this
        rank's block bytes plus 1 MiB).

    Raises
    ------
    CheckpointError, ShapeError, LayoutError, MismatchError
        On every rank, before anything is written; or, when writing failed
        on some rank (a full disk), on every rank after it, with nothing of
        the new checkpoint visible.
    """
    what, pairs, comm, early = _call("mr.save", path, state)
    rank, size = collective.rank_size(comm)

    def body():
        if early is not None:
            raise early
        workspace(0, workspace_bytes)       # a bad W raises on every rank, here
        where = os.fspath(path)
        entries = [entry(k, v, rank, size) for k, v in pairs]
        _names(entries, what)
        _check_comms(entries, comm)
        values = [{"path": list(e.key), "value": json_value(e.obj)}
                  for e in entries if e.kind == "value"]
        try:
            text = json.dumps(values)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{what}: a value cannot be saved as JSON: {exc}") from None
        gen = _next_generation(where)
        same = {"path": where, "generation": gen, "values": text,
                "entries": [e.signature() for e in entries if e.kind != "value"]}
        return (where, entries, gen, values), same

    where, entries, gen, values = collective.agree_on(comm, what, body)
    entries = [_reduced(e, rank, size) for e in entries]
    arrays = [e for e in entries if e.kind != "value"]
    folder = os.path.join(where, gen)
    mine = sum(e.block.nbytes for e in arrays if e.block is not None)
    w = workspace(mine, workspace_bytes)

    def write():
        items = []
        for k, e in enumerate(arrays):
            box = share(e, k)
            if box is None:
                continue
            block = e.block.reshape(1) if e.block.ndim == 0 else e.block
            held = e.held if e.held else ((0, 1),)
            items.append(Box(e.key, e.shape, grid(e.shape, e.dtype.itemsize), block, held, box))
        records, files, error = write_boxes(folder, rank, items, _buffer(w))
        dtypes = {e.name: dtype_text(e.dtype) for e in arrays if e.dtype is not None}
        return records, files, error, dtypes

    gathered = collective.allgather(comm, collective.guarded(comm, what, write))
    errors = [g[2] for g in gathered if g[2]]
    if errors:
        if rank == 0:
            remove_generation(folder)
        more = f" (and {len(errors) - 1} more rank(s))" if len(errors) > 1 else ""
        raise CheckpointError(f"{what}: {errors[0]}{more}; nothing was published, an "
                              "earlier checkpoint there is unchanged")
    error = None
    if rank == 0:
        error = collective.guarded(comm, what, _publish, where, gen, arrays, values, gathered,
                                   size, what)
        if error is not None:
            remove_generation(folder)
            error = CheckpointError(error)
    collective.agree_error(comm, what, error)


def _publish(where, gen, arrays, values, gathered, size, what):
    """Rank 0: the index of everything written, then the pointer (an error text or None)."""
    pieces, files, dtypes = {}, {}, {}
    for records, f, _, d in gathered:
        files.update(f)
        dtypes.update(d)
        for key, box, file, offset, crcs in records:
            pieces.setdefault(tuple(key), []).append(
                {"box": box, "file": file, "offset": offset, "crcs": crcs})
    docs = []
    for e in arrays:
        dt = dtypes.get(e.name)
        if dt is None:
            return f"{what}: no rank knows the dtype of {e.name!r}"
        got = pieces.get(e.key, [])
        volume = sum(math.prod(b - a for a, b in p["box"]) for p in got)
        if volume != math.prod(e.shape):
            return (f"{what}: the boxes written of {e.name!r} cover {volume} of its "
                    f"{math.prod(e.shape)} elements (a bug: please report it)")
        itemsize = np.dtype(e.dtype).itemsize if e.dtype is not None else \
            _itemsize(dt)
        docs.append({"path": list(e.key), "shape": list(e.shape), "dtype": dt,
                     "grid": list(grid(e.shape, itemsize)), "layout": e.describe,
                     "pieces": got})
    from .. import __version__
    doc = index_document(docs, values, files, {"ranks": size, "mpiredist": __version__})
    os.makedirs(os.path.join(where, gen), exist_ok=True)
    return publish(where, gen, doc)


def _itemsize(text):
    from ..core.backend import as_dtype
    return as_dtype(text).itemsize


def load(path, targets, *, workspace_bytes=None):
    """Load ``targets`` from the checkpoint at ``path`` (collective).

    Parameters
    ----------
    path : str or os.PathLike
        An mpiredist checkpoint, or a directory written by
        ``torch.distributed.checkpoint.save`` (DCP).
    targets : dict
        Names (nested dicts allowed) to what to load, a subset of the
        checkpoint: a DistArray or DTensor (filled in place: its mesh,
        layout and block), a ``(mesh, layout)`` pair (a new DistArray), a
        numpy array or torch tensor (replicated: the whole array, filled in
        place), or None (a small value).
    workspace_bytes : int, optional
        W: read buffers and the plan stay within it (default: a quarter of
        this rank's target bytes plus 1 MiB).

    Returns
    -------
    dict
        The same nesting, with the filled or new arrays and the values.

    Raises
    ------
    CheckpointError
        On every rank, before any target is written: a missing name,
        another shape or dtype, a truncated file, an unknown format, a path
        that is no checkpoint.  On a checksum mismatch found while reading:
        on every rank after the others finished; the arrays it names are
        *failed*: their blocks may hold a mix of old and new values (every
        other target is loaded).
    """
    what, pairs, comm, early = _call("mr.load", path, targets)
    rank, size = collective.rank_size(comm)

    def body():
        if early is not None:
            raise early
        workspace(0, workspace_bytes)       # a bad W raises on every rank, here
        where = os.fspath(path)
        index = read_any(where)
        entries = [entry(k, v, rank, size, target=True) for k, v in pairs]
        _names(entries, what)
        _check_comms(entries, comm)
        plans = [_plan_entry(e, index, what, rank) for e in entries]
        _check_files(entries, plans, index)
        same = {"path": where, "generation": index.generation,
                "targets": [e.signature() for e in entries]}
        return (index, entries, plans), same

    index, entries, plans = collective.agree_on(comm, what, body)
    fresh = [p is not None and e.kind == "new" and e.held is not None
             for e, p in zip(entries, plans)]
    mine = sum(box_size(e.held) * np.dtype(e.dtype).itemsize if new else
               (e.block.nbytes if p is not None and e.block is not None else 0)
               for e, p, new in zip(entries, plans, fresh))
    w = workspace(mine, workspace_bytes)

    def read():
        items = []
        for e, pieces, new in zip(entries, plans, fresh):
            if new:     # inside the guard: a failed allocation ends the job, no rank waits
                e.block = np.empty(box_shape(e.held), dtype=e.dtype)
            if pieces is None or e.block is None or not e.block.size:
                continue
            view = e.block.reshape(1) if e.block.ndim == 0 else e.block
            items.append((Target(e.name, e.held if e.held else ((0, 1),), view), pieces))
        try:
            return fill(items, _buffer(w)), None
        except (OSError, CheckpointError) as exc:
            return [], CheckpointError(f"{what}: rank {rank}: {exc}")

    failures, error = collective.guarded(comm, what, read)
    if failures and error is None:
        names = sorted({f[0] for f in failures})
        name, file, detail = failures[0]
        error = CheckpointError(f"{what}: array {name!r} in {file!r} is corrupt: {detail}; "
                                f"failed (partly loaded): {names}")
    collective.agree_error(comm, what, error)
    out = []
    for e in entries:
        out.append((e.key, _result(e, index, w)))
    return unflatten(out)


def _plan_entry(e, index, what, rank):
    """Check target ``e`` against the checkpoint; its pieces to read (None for values
    or where this rank holds nothing)."""
    where = index.where
    if e.kind == "value":
        if e.name not in index.values:
            raise CheckpointError(f"{what}: checkpoint {where!r} has no value {e.name!r}")
        return None
    a = index.arrays.get(e.name)
    if a is None:
        raise CheckpointError(f"{what}: checkpoint {where!r} has no array {e.name!r}")
    if e.kind == "new":
        e.shape, e.dtype = a.shape, a.dtype
        e.layout.validate(e.mesh, len(a.shape))
        e.mesh.check_ranks(collective.rank_size(collective.communicator(e.mesh))[1])
        device = device_of(e.mesh, rank)
        if device is not None:
            e.held = rank_block(a.shape, expand(e.layout, e.mesh), rank_digits(e.mesh, device))
    if tuple(e.shape) != a.shape:
        raise CheckpointError(f"{what}: array {e.name!r} has shape {a.shape} in checkpoint "
                              f"{where!r}, the target has {tuple(e.shape)}")
    if e.dtype is not None and np.dtype(e.dtype) != a.dtype:
        raise CheckpointError(f"{what}: array {e.name!r} has dtype {dtype_text(a.dtype)} in "
                              f"checkpoint {where!r}, the target has {dtype_text(e.dtype)}")
    if e.block is not None and not e.block.flags.writeable:
        raise ShapeError(f"{what}: the target of {e.name!r} is read-only")
    if e.held is None:
        return None
    held = e.held if e.held else ((0, 1),)
    if any(lo >= hi for lo, hi in held):
        return []
    return prepared(a, e.held)


def _check_files(entries, plans, index):
    """CheckpointError where a file this rank reads is shorter than its pieces."""
    sizes = {}
    for e, pieces in zip(entries, plans):
        for p in pieces or ():
            if p.file not in sizes:
                try:
                    sizes[p.file] = os.stat(p.file).st_size
                except OSError as exc:
                    raise CheckpointError(f"checkpoint {index.where!r}: cannot read {p.file!r} "
                                          f"of {e.name!r} ({exc.strerror})") from None
            end = p.offset + (p.geometry.nbytes if not p.whole else 0)
            if p.checked:
                end = max(end, p.crc_at + 4 * p.geometry.tiles)
            if sizes[p.file] < end:
                raise CheckpointError(f"checkpoint {index.where!r}: file {p.file!r} is "
                                      f"truncated: {sizes[p.file]} bytes, but the box "
                                      f"{list(p.box)} of {e.name!r} lies up to byte {end}")


def _result(e, index, w):
    if e.kind == "value":
        found = index.values[e.name]
        if isinstance(found, tuple) and found and found[0] == "dcp-bytes":
            return dcp.read_object(index, e.name, max(w, 1 << 20))
        return found
    if e.kind == "new":
        return DistArray(e.block, e.shape, e.layout, e.mesh)
    if isinstance(e.obj, np.generic):         # immutable: a new scalar
        return e.block[()]
    return e.obj
