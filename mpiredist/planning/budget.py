"""The runtime memory contract, predicted from a plan before it runs.

E is the number of bytes a call newly allocates at its peak; W the
workspace budget (default ``max(S, T) // 4 + 1 MiB``).  docs/semantics.md, Memory contract:

- not donated: E <= max(S, T) + W
- donated:     E <= max(0, T - S) + W

The out-of-place executor allocates each communicating step's output while
the previous one is alive; the in-place executor runs every step inside one
buffer of the plan's peak size.  A step that cannot run in place (an
exchange) needs a second buffer; :func:`assess` says so before anything
runs.  Not donated, the first communicating step reads the caller's block
and writes the buffer, so an exchange there needs no second buffer.
"""

from dataclasses import dataclass

from ..core.caches import PerObject

MIB = 1 << 20
# Bytes of the limit left for what else a call allocates while its buffers
# are alive: lists and datatypes, and on a first call the planner's caches
# (measured: 240 KiB for c01 at 2 ranks, tracemalloc, tests/mpi/test_memory.py).
MARGIN = 512 << 10

__all__ = ["default_workspace", "workspace_for", "reduction_room", "Budget", "assess", "inplace_reason", "frame_shape",
           "buffer_bytes", "out_of_place_peak", "Choice", "choose", "in_place_plan",
           "contract_limit", "fresh_buffer_fits", "MARGIN"]


def contract_limit(plan, donate, workspace):
    """The contract's bound on E: ``max(S, T) + W``, or ``max(0, T - S) + W`` donated."""
    s, t = plan.src_local_bytes, plan.dst_local_bytes
    return (max(0, t - s) if donate else max(s, t)) + workspace


def fresh_buffer_fits(plan, workspace):
    """True if a donated one-buffer run may take a new buffer of the plan's
    capacity (and half the workspace beside it) within the donated bound,
    without counting on the donated block's memory being released."""
    limit = contract_limit(plan, True, workspace)
    return buffer_bytes(plan) + workspace // 2 <= limit - MARGIN


def default_workspace(plan):
    """``max(S, T) // 4 + 1 MiB``: the default workspace budget W."""
    return workspace_for(max(plan.src_local_bytes, plan.dst_local_bytes))


def workspace_for(max_block_bytes):
    """The default W for blocks of at most ``max_block_bytes``: a quarter, plus 1 MiB."""
    return max_block_bytes // 4 + MIB


def inplace_reason(plan, step):
    """None if ``step`` can run in place, else why not."""
    if step.op == "exchange":
        return "an exchange moves arbitrary pieces between ranks"
    return None


def frame_shape(plan, step):
    """Padded block shape for an in-place all-to-all or reduce-scatter, or None.

    With uneven lengths the members' pieces differ in size, which
    ``MPI_IN_PLACE`` cannot express; padding each piece to the largest one
    (as XLA does) makes them equal.  The padding is small: at most one
    element per shard along the dims involved.
    """
    if step.op not in ("all_to_all", "reduce_scatter"):
        return None
    shape, g = plan.step_shape, step.group_size
    frame = list(step.local_shape_before)
    j = step.dims[-1]
    frame[j] = g * -(-shape[j] // step.after.counts()[j])
    return tuple(frame)


def buffer_bytes(plan):
    """Size of the in-place executor's buffer: the plan's peak, or a padded frame
    (kept per plan object: a donated run asks on every run)."""
    return _BUFFERS.get(plan, _buffer_bytes)


def _buffer_bytes(plan):
    frames = (_bytes(f, plan.dtype.itemsize) for f in map(lambda s: frame_shape(plan, s),
                                                          plan.steps) if f is not None)
    return max([plan.peak_local_bytes, plan.src_local_bytes, plan.dst_local_bytes, *frames])


_BUFFERS = PerObject(256)


def reduction_room(workspace):
    """Bytes one reduction call may carry (MPI allocates about as much inside
    it): half the workspace, at least 64 KiB.  Larger reductions go by parts
    (:func:`mpiredist.runtime.steps.reduce_by_parts`)."""
    return max(1 << 16, workspace // 2)


def out_of_place_peak(plan, workspace=None):
    """E of the out-of-place executor: outputs of consecutive steps coexist,
    and a reduce-scatter may pack its block, or stage up to twice the
    reduction room, beside them."""
    itemsize = plan.dtype.itemsize
    w = default_workspace(plan) if workspace is None else workspace
    live = peak = 0
    for step in plan.steps:
        if step.op == "slice":
            continue
        out = _bytes(step.local_shape_after, itemsize)
        extra = min(_bytes(step.local_shape_before, itemsize), 2 * reduction_room(w)) \
            if step.op == "reduce_scatter" else 0
        peak = max(peak, live + out + extra)
        live = out
    return peak


def _bytes(shape, itemsize):
    n = itemsize
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True)
class Budget:
    """What a run will allocate, against the contract."""

    workspace: int
    limit: int
    inplace_peak: int
    out_of_place_peak: int
    blocked: tuple          # (step index, reason) for steps that cannot run in place

    @property
    def inplace_ok(self):
        return not self.blocked

    def __str__(self):
        text = (f"memory: limit {self.limit} B (W = {self.workspace} B), in place "
                f"{self.inplace_peak} B, out of place {self.out_of_place_peak} B")
        for i, why in self.blocked:
            text += f"\n  step {i} cannot run in place: {why}"
        return text


def assess(plan, donate=False, workspace=None):
    """Predict E for both executors and the contract's limit."""
    w = default_workspace(plan) if workspace is None else int(workspace)
    s = plan.src_local_bytes
    limit = contract_limit(plan, donate, w)
    first = next((i for i, step in enumerate(plan.steps) if step.op != "slice"), None)
    blocked = tuple((i, why) for i, step in enumerate(plan.steps)
                    if (why := inplace_reason(plan, step)) is not None
                    and not (i == first and not donate))
    buffer = buffer_bytes(plan)
    grow = buffer - s if donate else buffer
    extra = max((_bytes(plan.steps[i].local_shape_after, plan.dtype.itemsize)
                 for i, _ in blocked), default=0)
    return Budget(w, limit, grow + min(w, buffer) + extra, out_of_place_peak(plan, w), blocked)


@dataclass(frozen=True)
class Choice:
    """How :func:`mpiredist.redistribute` runs a plan, decided before it runs.

    ``inplace`` False: the out-of-place executor, with ``slack`` bytes of
    pack buffer; True: the in-place executor, with workspace ``budget.workspace``.
    """

    plan: object
    inplace: bool
    slack: int
    budget: Budget

    @property
    def executor(self):
        return "in place" if self.inplace else "out of place"


def choose(plan, donate=False, workspace=None, gpu=False, without_exchange=None,
           in_place=False):
    """The executor that keeps the contract: out of place if its peak fits
    (it is the faster one), else in one buffer.

    ``without_exchange``, if given, returns the plan to run in place instead
    when ``plan`` has a step that cannot run in place (the planner's plan
    without exchange steps).  GPU arrays always run out of place (no
    in-place executor for them yet).  ``in_place`` runs host arrays in one
    buffer even where out of place fits (a benchmark's choice).
    """
    fits = assess(plan, donate, workspace)
    if gpu or (not donate and not in_place and fits.out_of_place_peak <= fits.limit):
        return Choice(plan, False, max(0, fits.limit - fits.out_of_place_peak), fits)
    return Choice(*in_place_plan(plan, fits, donate, workspace, without_exchange))


def in_place_plan(plan, fits, donate, workspace, without_exchange):
    """``(plan, True, 0, budget)`` for the in-place executor (see :func:`choose`)."""
    if not fits.inplace_ok and without_exchange is not None:
        plan = without_exchange()
        fits = assess(plan, donate, workspace)
    return plan, True, 0, fits
