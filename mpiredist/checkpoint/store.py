"""``mr.checkpoint.open``: a checkpoint's names, shapes and dtypes, and any box of
it, in one process without MPI.

    ck = mr.checkpoint.open("run/ckpt")
    ck.names                       # ['model.layers.0.wq', ...]
    ck.shape("model.emb"), ck.dtype("model.emb")
    rows = ck.read("model.emb", box=[(0, 100), (0, 512)])    # numpy, verified

Works on mpiredist checkpoints and on DCP directories alike; reads only
the byte ranges of the box (whole tiles, each checked against its CRC-32).
"""

import math
import os

import numpy as np

from ..core.errors import CheckpointError
from . import dcp
from .index import POINTER, read_index
from .plan import Target
from .reader import Stats, fill

__all__ = ["Checkpoint", "open", "read_any", "DEFAULT_BUFFER"]

DEFAULT_BUFFER = 16 << 20       # read buffer of a Checkpoint.read


def read_any(path):
    """The index of the checkpoint at ``path``: mpiredist's, else DCP's."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, POINTER)):
        return read_index(path)
    if dcp.is_dcp(path):
        return dcp.read_metadata(path)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    raise CheckpointError(f"{path!r} is not a checkpoint: it holds neither {POINTER} "
                          f"(mpiredist) nor {dcp.METADATA} (DCP)")


class Checkpoint:
    """A saved checkpoint, opened for reading (see the module doc)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.index = read_any(self.path)

    @property
    def kind(self):
        """``"mpiredist"`` or ``"dcp"``."""
        return self.index.kind

    @property
    def names(self):
        """The arrays' names, sorted."""
        return sorted(self.index.arrays)

    @property
    def values(self):
        """The small values (mpiredist checkpoints), by name."""
        return {k: v for k, v in self.index.values.items() if not _dcp_bytes(v)}

    def array(self, name):
        found = self.index.arrays.get(name)
        if found is None:
            raise CheckpointError(f"checkpoint {self.path!r} has no array {name!r}"
                                  + _close(name, self.index.arrays))
        return found

    def shape(self, name):
        return self.array(name).shape

    def dtype(self, name):
        return self.array(name).dtype

    def read(self, name, box=None, buffer_bytes=DEFAULT_BUFFER, stats=None):
        """The box ``box`` (``[(start, stop), ...]`` per dim; default: all) of array
        ``name`` as a new numpy array; CheckpointError on a checksum mismatch."""
        a = self.array(name)
        box = tuple((0, n) for n in a.shape) if box is None else tuple(
            (int(lo), int(hi)) for lo, hi in box)
        if len(box) != len(a.shape) or any(
                not 0 <= lo <= hi <= n for (lo, hi), n in zip(box, a.shape)):
            raise CheckpointError(f"array {name!r} of shape {a.shape}: box {list(box)} is "
                                  "not inside it")
        out = np.empty(tuple(hi - lo for lo, hi in box), dtype=a.dtype)
        if out.size:
            target = Target(name, box if box else ((0, 1),), out.reshape(-1) if not box
                            else out)
            pieces = prepared(a, target.box)
            failures = fill([(target, pieces)], buffer_bytes, stats or Stats())
            if failures:
                raise CheckpointError(f"array {failures[0][0]!r} in {failures[0][1]!r}: "
                                      f"{failures[0][2]}")
        return out

    def __repr__(self):
        return f"Checkpoint({self.path!r}, {self.kind}, {len(self.index.arrays)} arrays)"


def _dcp_bytes(v):
    return isinstance(v, tuple) and len(v) == 2 and v[0] == "dcp-bytes"


def prepared(array, box):
    """The pieces of ``array`` that overlap ``box``, located (DCP), checked to
    cover it."""
    norm = box if box else ((0, 1),)
    out = []
    covered = 0
    for p in array.pieces:
        pbox = p.box if p.box else ((0, 1),)
        over = [(max(a, c), min(b, d)) for (a, b), (c, d) in zip(pbox, norm)]
        if any(lo >= hi for lo, hi in over):
            continue
        if hasattr(p, "locate"):
            p.locate()
        out.append(p)
        covered += math.prod(hi - lo for lo, hi in over)
    if covered < math.prod(hi - lo for lo, hi in norm):
        raise CheckpointError(f"array {array.name!r}: the saved pieces do not cover the box "
                              f"{list(box)} (the index is incomplete)")
    return out


def _close(name, known):
    near = [k for k in known if k.split(".")[-1] == name.split(".")[-1]][:3]
    return f" (similar: {near})" if near else ""


def open(path):     # noqa: A001 - the module's public verb, as io.open
    """Open the checkpoint at ``path`` for reading (:class:`Checkpoint`)."""
    return Checkpoint(path)
