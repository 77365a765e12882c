"""What a compiled Transfer's runs execute, as text (``Transfer.explain``).

Everything here is worked out from the plan and the agreed workspace, the
same on every rank; printing never communicates.
"""

from ..planning.pieces import part_limit, parts
from ..planning.plans import format_bytes
from .steps import group_sides

__all__ = ["explain_choice"]


def explain_choice(variant, choice):
    """Lines for one variant of a run: executor, limit, predicted peak, and a
    line per step with its bytes and how its messages are cut."""
    fits = choice.budget
    head = (f"\n[{variant.name.lower()}: {variant.value}] executor {choice.executor}; "
            f"limit {format_bytes(fits.limit)}, predicted peak "
            f"{format_bytes(fits.inplace_peak if choice.inplace else fits.out_of_place_peak)}")
    if not choice.inplace:
        head += f", pack room {format_bytes(choice.slack)}"
    rows = [f"  step {i}: {step} sends {format_bytes(step.bytes_sent_per_rank)}/rank, "
            f"{_parts(choice, step)}" for i, step in enumerate(choice.plan.steps)]
    return [head, *rows] if rows else [head, "  (no steps)"]


def _parts(choice, step):
    """Message parts of a step (from the plan, the same on every rank)."""
    if step.op == "slice":
        return "local"
    if step.op in ("all_to_all", "all_gather") and not choice.inplace:
        itemsize = choice.plan.dtype.itemsize
        limit = part_limit(itemsize, max(0, choice.slack), group_sides(step, True))
        piece = tuple(-(-n // step.group_size) if k == step.dims[-1] else n
                      for k, n in enumerate(step.local_shape_before))
        return f"{len(parts(piece, limit))} part(s) per piece, pipelined"
    return "1 round"
