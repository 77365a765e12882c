"""Pictures of a plan: which rank holds which block, before and after, and the steps.

:func:`draw_plan` writes one PNG: the source layout on the left, the target
layout on the right (the array as a rectangle, one cell per distinct block,
coloured by the rank that holds it; ranks that hold the same block share the
cell in stripes), and below them the plan's :meth:`~mpiredist.Plan.explain`
table: one row per step with its op, mesh axes, dims, local shapes and bytes
sent per rank, then the totals.  ``python -m mpiredist plan ... --draw
FILE.png`` calls it.

Arrays of more than two dims are drawn on two of them (:func:`drawn_dims`:
the first dims that a layout shards); the caption names the dims left out.
Blocks are computed from the layouts alone (docs/semantics.md, Local
block), without MPI.  matplotlib (the ``bench`` extra) is imported only by
:func:`require_matplotlib`.
"""

import textwrap

from .core.blocks import interval
from .core.layout import Layout

__all__ = ["draw_plan", "plan_figure", "drawn_dims", "rank_boxes", "require_matplotlib"]

# Cells narrower than this fraction of the panel get no rank label.
_LABEL_ROOM = 0.035
# Lines of the steps table are wrapped at this many characters.
_WRAP = 120
# Inches: the layout panels, and the room above them for the title.
_PANELS, _TITLE = 4.4, 0.9
# The array's drawn aspect ratio (rows over columns) is kept within these.
_ASPECT = (1 / 3, 3)


def require_matplotlib():
    """Import and return ``matplotlib.pyplot`` on the Agg backend.

    Raises
    ------
    ImportError
        Without matplotlib, saying how to install it.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("drawing needs matplotlib: pip install matplotlib "
                          "(or 'mpiredist[bench]')") from exc
    return plt


def _meshes(plan):
    """``(source mesh, target mesh)`` of a Plan (one mesh) or a CrossPlan."""
    mesh = getattr(plan, "mesh", None)
    if mesh is not None:
        return mesh, mesh
    return plan.src_mesh, plan.dst_mesh


def rank_boxes(global_shape, mesh, layout):
    """Each device's block of ``layout`` on ``mesh``: ``[(rank, box), ...]``.

    Parameters
    ----------
    global_shape : tuple of int
        The array's shape.
    mesh : Mesh
        The mesh the layout is on; ``rank`` is the communicator rank of each
        device (its ``ranks=``, or the device index).
    layout : Layout or str
        The layout.

    Returns
    -------
    list of (int, tuple of (int, int))
        Per device, in device order: its rank and per dim its global
        ``(start, stop)`` (docs/semantics.md, Local block).
    """
    layout = Layout.parse(layout)
    sizes = dict(mesh.axes)
    ranks = (tuple(range(mesh.size)) if mesh.ranks is None or mesh.auto
             else mesh.device_ranks())
    out = []
    for device in range(mesh.size):
        coords = dict(zip(mesh.names, mesh.coords(device)))
        box = []
        for n, axes in zip(global_shape, layout.dims):
            k, p = 1, 0
            for a in axes:
                k *= sizes[a]
                p = p * sizes[a] + coords[a]
            box.append(interval(n, k, p))
        out.append((ranks[device], tuple(box)))
    return out


def drawn_dims(layouts, ndim):
    """The two array dims to draw (one for a 1-D array, none for a scalar).

    The first dims that any of ``layouts`` shards, in order, then the
    first others: a 3-D array moved from ``[{x}, {}, {}]`` to
    ``[{}, {}, {x}]`` is drawn on dims 0 and 2.
    """
    sharded = [d for d in range(ndim) if any(lay.dims[d] for lay in layouts)]
    rest = [d for d in range(ndim) if d not in sharded]
    return tuple(sorted((sharded + rest)[:2]))


def _colour(plt, rank, count):
    """A colour per rank: tab10 or tab20 (integer index), else spread over hsv."""
    if count <= 20:
        return plt.get_cmap("tab10" if count <= 10 else "tab20")(rank % 20)
    return plt.get_cmap("hsv")((rank % count) / count)


def _panel(ax, plt, shape, dims, boxes, title, count):
    """Draw one layout: a cell per distinct drawn block, striped by its holders."""
    lengths = [shape[d] for d in dims] + [1] * (2 - len(dims))
    rows, cols = lengths
    aspect = min(max(rows / cols if cols else 1.0, _ASPECT[0]), _ASPECT[1]) if rows else 1.0
    height, width = (1.0, 1.0 / aspect) if aspect >= 1 else (aspect, 1.0)
    cells = {}
    for rank, box in boxes:
        cell = tuple(box[d] for d in dims) + ((0, 1),) * (2 - len(dims))
        cells.setdefault(cell, []).append(rank)
    empty = sorted(r for cell, rs in cells.items()
                   if any(lo >= hi for lo, hi in cell) for r in rs)
    for ((r0, r1), (c0, c1)), holders in cells.items():
        if r0 >= r1 or c0 >= c1:
            continue
        x0, x1 = width * c0 / cols, width * c1 / cols
        y0, y1 = height * (1 - r1 / rows), height * (1 - r0 / rows)
        step = (x1 - x0) / len(holders)
        for i, rank in enumerate(holders):
            ax.add_patch(plt.Rectangle((x0 + i * step, y0), step, y1 - y0,
                                       facecolor=_colour(plt, rank, count),
                                       edgecolor="none", alpha=0.85))
        ax.add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False,
                                   edgecolor="black", linewidth=1.2))
        label = _holders_text(holders)
        if step >= _LABEL_ROOM or (x1 - x0 >= 2 * _LABEL_ROOM and len(label) <= 12):
            ax.text((x0 + x1) / 2, (y0 + y1) / 2, label, ha="center", va="center",
                    fontsize=8 if len(label) <= 12 else 6, wrap=True,
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white",
                              edgecolor="none", alpha=0.7))
    ax.add_patch(plt.Rectangle((0, 0), width, height, fill=False, edgecolor="black",
                               linewidth=2))
    ax.set_xlim(-0.02, width + 0.02)
    ax.set_ylim(-0.02, height + 0.02)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=10)
    names = [f"dim {d} ({shape[d]})" for d in dims]
    if len(names) == 2:
        ax.set_ylabel(names[0] + " \u2193", fontsize=8)
        ax.set_xlabel(names[1] + " \u2192", fontsize=8)
    elif names:
        ax.set_xlabel(names[0] + " \u2192", fontsize=8)
    if empty:
        ax.text(0, -0.06, "empty blocks: " + _holders_text(empty), fontsize=7,
                transform=ax.transAxes, va="top")


def _holders_text(ranks):
    """``r0`` or ``r0,r4`` or ``r0..r7`` (a run) or ``r0,r2,..(4)``."""
    ranks = list(ranks)
    if len(ranks) == 1:
        return f"r{ranks[0]}"
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))) and len(ranks) > 2:
        return f"r{ranks[0]}..r{ranks[-1]}"
    if len(ranks) <= 3:
        return ",".join(f"r{r}" for r in ranks)
    return f"r{ranks[0]},r{ranks[1]},..({len(ranks)})"


def _layout_title(which, layout, mesh):
    text = f"{which}: {layout}\non mesh {mesh}"
    if layout.partial:
        text += f"\n(partial {layout.op}s over {','.join(layout.partial)})"
    return text


def _caption(shape, dims, layouts):
    hidden = [d for d in range(len(shape)) if d not in dims]
    if not hidden:
        return ""
    split = [d for d in hidden if any(lay.dims[d] for lay in layouts)]
    text = f"dims {', '.join(map(str, hidden))} not drawn"
    if split:
        text += (f" (split in a layout: {', '.join(map(str, split))}; ranks that differ "
                 "only there share a cell)")
    return text


def plan_figure(plan, dims=None):
    """A matplotlib figure of ``plan``: both layouts above, the steps below.

    Parameters
    ----------
    plan : Plan or CrossPlan
        From :func:`mpiredist.plan`.
    dims : tuple of int, optional
        The one or two array dims to draw (default :func:`drawn_dims`).

    Returns
    -------
    matplotlib.figure.Figure
        Close it with ``matplotlib.pyplot.close(fig)`` when done.
    """
    plt = require_matplotlib()
    shape = tuple(plan.global_shape)
    src, dst = Layout.parse(plan.src), Layout.parse(plan.dst)
    if dims is None:
        dims = drawn_dims((src, dst), len(shape))
    dims = tuple(dims)
    if len(dims) > 2 or any(not 0 <= d < len(shape) for d in dims) or \
            len(set(dims)) != len(dims):
        raise ValueError(f"dims {dims}: expected one or two distinct dims of an array "
                         f"of {len(shape)} dims")
    src_mesh, dst_mesh = _meshes(plan)
    count = max(src_mesh.size, dst_mesh.size, *(
        max((r for r, _ in rank_boxes(shape, m, lay)), default=0) + 1
        for m, lay in ((src_mesh, src), (dst_mesh, dst))))
    text = "\n".join(textwrap.fill(line, _WRAP, subsequent_indent="    ",
                                    drop_whitespace=False) if len(line) > _WRAP else line
                      for line in plan.explain().splitlines())
    lines = text.count("\n") + 1
    width = max(10.0, min(15.0, 0.09 * max(len(l) for l in text.splitlines())))
    table = 0.16 * lines + 0.15
    height = _PANELS + table + _TITLE
    fig = plt.figure(figsize=(width, height))
    grid = fig.add_gridspec(2, 2, height_ratios=[_PANELS, table], hspace=0.3,
                            top=1 - _TITLE / height, bottom=0.02, left=0.05, right=0.97)
    for col, (which, mesh, layout) in enumerate((("source", src_mesh, src),
                                                 ("target", dst_mesh, dst))):
        ax = fig.add_subplot(grid[0, col])
        _panel(ax, plt, shape, dims, rank_boxes(shape, mesh, layout),
               _layout_title(which, layout, mesh), count)
    steps = fig.add_subplot(grid[1, :])
    steps.axis("off")
    steps.text(0.0, 1.0, text, family="monospace", fontsize=8.5, va="top", ha="left",
               transform=steps.transAxes)
    caption = _caption(shape, dims, (src, dst))
    size = "x".join(map(str, shape)) or "scalar"
    fig.suptitle(f"{size} {plan.dtype}: {src}  \u2192  {dst}"
                 + (f"\n{caption}" if caption else ""), fontsize=11)
    return fig


def draw_plan(plan, path, dims=None, dpi=110):
    """Write the picture of ``plan`` (:func:`plan_figure`) to ``path``.

    Parameters
    ----------
    plan : Plan or CrossPlan
        From :func:`mpiredist.plan`.
    path : str or os.PathLike
        The file; its suffix picks the format (``.png``, ``.svg``, ``.pdf``).
    dims : tuple of int, optional
        The array dims to draw (default :func:`drawn_dims`).
    dpi : int
        Resolution of raster formats.

    Returns
    -------
    str
        ``path``, as given.
    """
    plt = require_matplotlib()
    fig = plan_figure(plan, dims)
    try:
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path
