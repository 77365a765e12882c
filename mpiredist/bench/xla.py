"""XLA's own plan for each shared case, expressed as mpiredist moves.

``xla_plans.json`` records the collectives XLA's SPMD partitioner emits for
each case of ``cases.json``.  :data:`XLA_MOVES` restates each sequence as our
moves over sub-axes, with the intermediate layouts read off XLA's shapes, so
that the benchmark runs XLA's plan on our executor and compares like with
like.  This is a hand-checked table, not an XLA parser.

Reading the XLA text:

- ``y:(1)2`` is the major size-2 factor of ``y`` (our ``y:0``), ``y:(2)2``
  the minor one (``y:1``) when ``y = 4 = 2*2``.
- ``all-to-all(dimK, over A, G, f32[...])``: the operand is reshaped so that
  dim K is split ``G`` ways; the axes ``A`` leave the dim they were the
  minor axes of and become the minor axes of dim K.  Our move is
  ``all_to_all`` with dims ``(losing dim, K)``.
- ``dynamic-slice`` is our ``slice``; the new (minor) axes are the free
  axes whose size matches the shrink factor.
- ``collective-permute`` is our ``permute``; XLA does not name its layout,
  only its shapes, so the table picks one with the right shard counts
  (any such layout gives the same bytes; the executor pairs ranks itself).
- ``all-reduce ; dynamic-slice`` is ``all_reduce`` then ``slice``.

XLA pads lengths that its shards do not divide; our blocks are not padded,
so a slice, gather or all-to-all is exact only where the finer shards tile
the coarser ones (:func:`mpiredist.core.blocks.aligned`).  :func:`xla_plan`
refuses shapes where a step of XLA's sequence would not (c13's single
all-to-all is exact at any shape).

Layout text here is over sub-axes: ``y`` is the whole axis, ``y:1`` one
digit (:class:`mpiredist.core.subaxes.SubAxis` index, major first).

Examples
--------
>>> p = xla_plan("c04", shape=(64, 64))
>>> [s.op for s in p.steps]
['all_to_all', 'permute']
"""

import re

from ..core.blocks import aligned, group_size
from ..core.errors import PlanError
from ..core.layout import REDUCE_OPS
from ..planning.planner import assemble, validate
from ..core.subaxes import SubLayout, expand, sub_axes
from .cases import get_case, load_xla_plans

__all__ = ["XLA_MOVES", "xla_plan", "xla_ops", "parse_sublayout"]

# case -> (source layout, [(op, axes, dims, layout after), ...]); the
# comment above each entry is XLA's sequence (local shapes at full size).
XLA_MOVES = {
    # all-to-all(dim1, over x, G=8, f32[512,8,512])
    "c01": ("[{x},{}]", [("all_to_all", "x", (0, 1), "[{},{x}]")]),
    # all-gather(dim0, over x, G=8, f32[512,4096]->f32[4096,4096])
    "c02": ("[{x},{}]", [("all_gather", "x", (0,), "[{},{}]")]),
    # dynamic-slice(f32[4096,4096]->f32[512,4096])
    "c03": ("[{},{}]", [("slice", "x", (0,), "[{x},{}]")]),
    # all-to-all(dim0, over y:(2)2, G=2, f32[2,1024,1024]): y:1 leaves dim 1
    # (local 2048x1024 -> 1024x2048); collective-permute(f32[1024,2048])
    "c04": ("[{x},{y}]", [("all_to_all", "y:1", (1, 0), "[{x,y:1},{y:0}]"),
                          ("permute", "x,y", (0, 1), "[{y},{x}]")]),
    # all-to-all(dim1, over (x,y), G=8, f32[512,8,512])
    "c05": ("[{x,y},{}]", [("all_to_all", "x,y", (0, 1), "[{},{x,y}]")]),
    # collective-permute(8 pairs, f32[512,4096])
    "c06": ("[{x,y},{}]", [("permute", "x,y", (0,), "[{y,x},{}]")]),
    # dynamic-slice(f32[2048,4096]->f32[1024,4096]): dim 0 by 2 more, over
    # the major free factor y:(1)2; collective-permute(f32[1024,4096])
    "c07": ("[{x},{}]", [("slice", "y:0", (0,), "[{x,y:0},{}]"),
                         ("permute", "x,y", (0,), "[{y},{}]")]),
    # collective-permute(8 pairs, f32[2048,2048])
    "c08": ("[{x},{y}]", [("permute", "x,y,z", (0, 1), "[{z},{x}]")]),
    # all-to-all(dim1, over y, G=2, f32[1024,2,1024]): y leaves dim 0
    # (1024x2048 -> 2048x1024); collective-permute(f32[2048,1024])
    "c09": ("[{x,y},{z}]", [("all_to_all", "y", (0, 1), "[{x},{z,y}]"),
                            ("permute", "x,y,z", (0, 1), "[{z},{x,y}]")]),
    # all-to-all(dim2, over y, G=4, f32[128,64,4,64]): y dim 1 -> dim 2;
    # all-to-all(dim1, over x, G=2, f32[128,2,128,64]): x dim 0 -> dim 1
    "c10": ("[{x},{y},{}]", [("all_to_all", "y", (1, 2), "[{x},{},{y}]"),
                             ("all_to_all", "x", (0, 1), "[{},{x},{y}]")]),
    # all-reduce(over x, G=8, f32[4096,4096]) ; dynamic-slice(->f32[512,4096])
    "c11": ("[{},{}] sum{x}", [("all_reduce", "x", (), "[{},{}]"),
                               ("slice", "x", (0,), "[{x},{}]")]),
    # all-reduce(over x, G=8, f32[2048,2048])
    "c12": ("[{},{}] sum{x}", [("all_reduce", "x", (), "[{},{}]")]),
    # all-to-all(dim1, over x, G=8, f32[513,8,512]) (XLA pads to 4104x4096)
    "c13": ("[{x},{}]", [("all_to_all", "x", (0, 1), "[{},{x}]")]),
    # collective-permute(f32[1024,4096]) to a layout whose minor factor is
    # y:(1)2; all-gather(dim0, over y:(1)2, G=2, ->f32[2048,4096])
    "c14": ("[{y},{}]", [("permute", "x,y", (0,), "[{x,y:0},{}]"),
                         ("all_gather", "y:0", (0,), "[{x},{}]")]),
    # all-to-all(dim1, over y, G=4, f32[1,4,512,1024]): y dim 1 -> dim 0
    "c15": ("[{x},{y}]", [("all_to_all", "y", (1, 0), "[{x,y},{}]")]),
    # collective-permute(16 pairs, f32[1024,1024])
    "c16": ("[{x},{y}]", [("permute", "x,y", (0, 1), "[{y},{x}]")]),
    # dynamic-slice(f32[1024,4096]->f32[1024,2048]): dim 1 over the free y;
    # all-to-all(dim1, over x:(2)2, G=2, f32[1024,2,1024]): x:1 dim 0 -> 1;
    # collective-permute(f32[2048,1024])
    "c17": ("[{x},{}]", [("slice", "y", (1,), "[{x},{y}]"),
                         ("all_to_all", "x:1", (0, 1), "[{x:0},{y,x:1}]"),
                         ("permute", "x,y", (0, 1), "[{y},{x}]")]),
    # all-reduce(over y, G=4, f32[2048,4096]) ; dynamic-slice(->f32[2048,1024])
    # over y ; all-to-all(dim2, over x, G=2, f32[2048,1,2,512]): x dim 0 -> 1
    "c18": ("[{x},{}] sum{y}", [("all_reduce", "y", (), "[{x},{}]"),
                                ("slice", "y", (1,), "[{x},{y}]"),
                                ("all_to_all", "x", (0, 1), "[{},{y,x}]")]),
}

# XLA's instruction names -> our step ops.
XLA_OP_NAMES = {"all-to-all": "all_to_all", "all-gather": "all_gather",
                "all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter",
                "collective-permute": "permute", "dynamic-slice": "slice"}

_TEXT = re.compile(r"\s*\[(?P<dims>[^\]]*)\]\s*(?:(?P<op>[a-z]+)\s*\{(?P<partial>[^}]*)\}\s*)?\Z")


def _group(text, subs):
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, index = item.partition(":")
        if name not in subs:
            raise ValueError(f"sub-axis group {text!r}: no mesh axis {name!r}")
        out.extend(subs[name] if not index else (subs[name][int(index)],))
    return tuple(out)


def parse_sublayout(text, mesh):
    """Parse a layout over sub-axes (``"[{x,y:1},{y:0}] sum{z}"``) on ``mesh``."""
    m = _TEXT.match(text)
    if not m:
        raise ValueError(f"sub-axis layout {text!r} is malformed")
    subs = sub_axes(mesh.axes)
    dims = tuple(_group(d, subs) for d in re.findall(r"\{([^{}]*)\}", m.group("dims")))
    op = m.group("op") or "sum"
    if op not in REDUCE_OPS:
        raise ValueError(f"sub-axis layout {text!r}: reduction {op!r}")
    return SubLayout(dims, _group(m.group("partial") or "", subs), op)


def xla_ops(case_id):
    """Our op names for XLA's recorded sequence of ``case_id`` (from the JSON)."""
    case = get_case(case_id)
    text = load_xla_plans()[case.id]["xla_sequence"]
    names = [part.strip().split("(")[0] for part in text.split(";") if part.strip()]
    return [XLA_OP_NAMES[n] for n in names]


def xla_plan(case_id, shape=None, dtype="float32", topology=None):
    """XLA's plan for shared case ``case_id`` (``"c04"`` or the full id).

    Parameters
    ----------
    case_id : str
    shape : sequence of int, optional
        The global shape (default: the case's); the moves do not depend on it.
    dtype : numpy dtype, default float32
    topology : Topology, optional
        The node of each device: the plan then knows its across-node bytes.

    Returns
    -------
    Plan
        With strategy ``"xla"`` and XLA's sequence as its note.
    """
    case = get_case(case_id)
    shape, dtype, mesh, src, dst = validate(case.shape if shape is None else shape,
                                            dtype, case.mesh, case.src, case.dst)
    start, table = XLA_MOVES[case.short_id]
    if parse_sublayout(start, mesh) != expand(src, mesh):
        raise AssertionError(f"XLA table of {case.id}: starts at {start}, not {src}")
    moves = [(op, _group(axes, sub_axes(mesh.axes)), dims, parse_sublayout(after, mesh))
             for op, axes, dims, after in table]
    state = expand(src, mesh)
    for move in moves:
        _check_nesting(case.id, shape, state, move)
        state = move[3]
    note = "XLA: " + load_xla_plans()[case.id]["xla_sequence"]
    return assemble(shape, dtype, mesh, src, dst, "xla", moves, note, topology)


def _check_nesting(case_id, shape, before, move):
    """Raise PlanError if ``move`` needs XLA's padding at ``shape``."""
    op, axes, dims, after = move
    g = group_size(axes)
    if op == "slice":
        checks = [(d, group_size(before.dims[d]), group_size(after.dims[d]) //
                   group_size(before.dims[d])) for d in dims]
    elif op == "all_gather":
        checks = [(dims[0], group_size(after.dims[dims[0]]), g)]
    elif op == "all_to_all":
        i, j = dims
        checks = [(i, group_size(after.dims[i]), g), (j, group_size(before.dims[j]), g)]
    else:
        checks = []
    for d, k, g in checks:
        if not aligned(shape[d], k, g):
            raise PlanError(f"XLA's plan of {case_id} at shape {shape}: its {op} over "
                            f"{g} on dim {d} needs padding (length {shape[d]} in {k} "
                            f"shards does not split evenly {g} ways); XLA pads, "
                            "our blocks are not padded")
