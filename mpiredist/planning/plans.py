"""Plans: immutable, inspectable sequences of redistribution steps.

Step kinds (docs/semantics.md, Plans) and what ``dims`` means for each:

============== ============================== ==================================
op             dims                           MPI (executor)
============== ============================== ==================================
slice          dims that get new minor axes   none (local copy)
all_gather     (d,): dim losing minor axes    Allgather(v)
all_to_all     (i, j): axes move dim i -> j   Alltoall(v/w)
reduce_scatter (j,): dim gaining the axes     Reduce_scatter(_block)
all_reduce     ()                             Allreduce
permute        dims whose axes are relabeled  Sendrecv (pairs)
exchange       all dims                       Alltoallv/w over the mesh
============== ============================== ==================================

``axes`` is the sub-communicator the step runs on (sub-axes, major first).
Every step carries the layouts before and after it over sub-axes.
"""

import json
from dataclasses import dataclass, field

import numpy as np

from ..core.layout import Layout
from ..core.mesh import Mesh
from ..core.subaxes import SubAxis, SubLayout, group_str  # noqa: F401  (repr namespace)

__all__ = ["Step", "Plan", "OPS", "format_bytes"]

OPS = ("slice", "all_gather", "all_to_all", "reduce_scatter", "all_reduce",
       "permute", "exchange")


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a plan: a collective (or a local slice) on ``axes``."""

    op: str
    axes: tuple
    dims: tuple
    before: SubLayout
    after: SubLayout
    local_shape_before: tuple
    local_shape_after: tuple
    bytes_sent_per_rank: int
    inter_node_bytes_per_rank: object = None    # int with a topology, else None

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"step op {self.op!r} is not one of {OPS}")

    @property
    def group_size(self):
        """Ranks in the step's sub-communicator."""
        n = 1
        for s in self.axes:
            n *= s.size
        return n

    def __str__(self):
        return (f"{self.op}({group_str(self.axes)}; dims {list(self.dims)}) "
                f"{self.before} -> {self.after}")

    def to_dict(self):
        return {"op": self.op, "axes": group_str(self.axes).split(",") if self.axes else [],
                "sub_axes": [str(s) for s in self.axes], "dims": list(self.dims),
                "group_size": self.group_size,
                "layout_before": str(self.before), "layout_after": str(self.after),
                "local_shape_before": list(self.local_shape_before),
                "local_shape_after": list(self.local_shape_after),
                "bytes_sent_per_rank": self.bytes_sent_per_rank,
                "inter_node_bytes_per_rank": self.inter_node_bytes_per_rank}


@dataclass(frozen=True, slots=True)
class Plan:
    """A redistribution of one array from ``src`` to ``dst`` on ``mesh``.

    Byte counts are per rank (maxima over ranks) with the bandwidth-optimal
    conventions of docs/semantics.md (Plans).  ``bytes_sent_per_rank`` is the sum
    over steps of each step's figure.
    """

    global_shape: tuple
    dtype: str
    mesh: Mesh
    src: Layout
    dst: Layout
    strategy: str
    steps: tuple
    src_local_bytes: int
    dst_local_bytes: int
    peak_local_bytes: int
    bytes_sent_per_rank: int
    lower_bound_bytes_per_rank: int
    note: str = field(default="")
    topology: object = None                     # the Topology it was planned for
    inter_node_lower_bound_bytes_per_rank: object = None
    view_shape: object = None                   # the shape its steps run on, if not global_shape

    @property
    def step_shape(self):
        """The global shape the steps run on: ``global_shape``, or the view of it
        with one dim split in two at a node boundary
        (:mod:`mpiredist.planning.views`) that the planner chose; the steps'
        layouts and local shapes are the view's, every rank's block the same
        memory in both."""
        return self.global_shape if self.view_shape is None else self.view_shape

    @property
    def inter_node_bytes_per_rank(self):
        """Sum over steps of their across-node bytes (None without a topology)."""
        if self.topology is None:
            return None
        return sum(s.inter_node_bytes_per_rank or 0 for s in self.steps)

    @property
    def itemsize(self):
        return np.dtype(self.dtype).itemsize

    @property
    def within_bound(self):
        """The memory theorem: no intermediate exceeds max(source, target)."""
        return self.peak_local_bytes <= max(self.src_local_bytes, self.dst_local_bytes)

    @property
    def rounds(self):
        """Number of communicating steps."""
        return sum(1 for s in self.steps if s.op != "slice")

    def to_dict(self):
        return {"strategy": self.strategy, "mesh": str(self.mesh),
                "global_shape": list(self.global_shape), "dtype": str(self.dtype),
                "view_shape": None if self.view_shape is None else list(self.view_shape),
                "src": str(self.src), "dst": str(self.dst),
                "steps": [s.to_dict() for s in self.steps],
                "src_local_bytes": self.src_local_bytes,
                "dst_local_bytes": self.dst_local_bytes,
                "peak_local_bytes": self.peak_local_bytes,
                "bytes_sent_per_rank": self.bytes_sent_per_rank,
                "lower_bound_bytes_per_rank": self.lower_bound_bytes_per_rank,
                "within_bound": self.within_bound, "rounds": self.rounds,
                "topology": None if self.topology is None else str(self.topology),
                "inter_node_bytes_per_rank": self.inter_node_bytes_per_rank,
                "inter_node_lower_bound_bytes_per_rank":
                    self.inter_node_lower_bound_bytes_per_rank,
                "note": self.note}

    def to_json(self, **kwargs):
        return json.dumps(self.to_dict(), **kwargs)

    def explain(self):
        """A readable table of the steps, then the totals."""
        head = (f"plan {self.strategy}: {list(self.global_shape)} {self.dtype} on mesh "
                f"{self.mesh}\n  {self.src}  ->  {self.dst}\n")
        if self.view_shape is not None:
            head += (f"  steps on the view {list(self.view_shape)} (a dim split at the node "
                     f"boundary): {self.steps[0].before}  ->  {self.steps[-1].after}\n")
        nodes = self.topology is not None
        rows = [("#", "op", "axes", "dims", "local before", "local after", "sent/rank")
                + (("across nodes",) if nodes else ())]
        for i, s in enumerate(self.steps):
            rows.append((str(i), s.op, group_str(s.axes) or "-",
                         ",".join(map(str, s.dims)) or "-",
                         _shape(s.local_shape_before), _shape(s.local_shape_after),
                         format_bytes(s.bytes_sent_per_rank))
                        + ((format_bytes(s.inter_node_bytes_per_rank or 0),) if nodes else ()))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        if not self.steps:
            lines.append("(no steps: source and target blocks are the same)")
        big = max(self.src_local_bytes, self.dst_local_bytes)
        ratio = self.peak_local_bytes / big if big else 1.0
        tail = (f"\nsource local {format_bytes(self.src_local_bytes)}, target local "
                f"{format_bytes(self.dst_local_bytes)}, peak {format_bytes(self.peak_local_bytes)} "
                f"({ratio:.2f} x max)\nsent per rank {format_bytes(self.bytes_sent_per_rank)}, "
                f"lower bound {format_bytes(self.lower_bound_bytes_per_rank)}, "
                f"{self.rounds} round(s)")
        if nodes:
            bound = self.inter_node_lower_bound_bytes_per_rank
            tail += (f"\nacross nodes ({self.topology}) per rank "
                     f"{format_bytes(self.inter_node_bytes_per_rank)}, lower bound "
                     f"{'not computed at this size' if bound is None else format_bytes(bound)}")
        if self.note:
            tail += f"\nnote: {self.note}"
        return head + "\n".join(lines) + tail

    def __str__(self):
        return self.explain()


def _shape(shape):
    return "(" + ",".join(map(str, shape)) + ")"


def format_bytes(n):
    """``n`` bytes as text: ``"512 B"``, ``"1.50 MiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
