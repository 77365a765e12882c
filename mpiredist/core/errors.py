"""Exceptions raised by mpiredist.

Every user error is a subclass of :class:`ValueError` whose message names the
object at fault (layout, mesh axis, shape, rank), what was expected and what
was found.  Failures inside MPI become :class:`CommunicationError`.
"""

__all__ = [
    "MpiredistError",
    "LayoutError",
    "MeshError",
    "ShapeError",
    "PlanError",
    "MismatchError",
    "RemoteError",
    "CommunicationError",
    "BudgetWarning",
    "DonationWarning",
]


class MpiredistError(Exception):
    """Base class of every exception raised by mpiredist."""


class LayoutError(MpiredistError, ValueError):
    """A layout is malformed or does not fit the mesh or the array."""


class MeshError(MpiredistError, ValueError):
    """A mesh is malformed or does not match its communicator."""


class ShapeError(MpiredistError, ValueError):
    """A global shape, local block or dtype is not what the layout implies."""


class PlanError(MpiredistError, ValueError):
    """A redistribution that no strategy can express (e.g. creating partials)."""


class MismatchError(MpiredistError, ValueError):
    """Ranks disagree on the arguments of a collective call."""


class RemoteError(MpiredistError, ValueError):
    """Another rank found bad input; raised on the ranks that did not."""


class CommunicationError(MpiredistError, RuntimeError):
    """An MPI call failed while a plan step was running."""


class BudgetWarning(ResourceWarning):
    """A redistribution will allocate more than its workspace budget allows."""


class DonationWarning(BudgetWarning):
    """A donated block could not be reused on some rank; the call copied instead.

    Every rank then runs as if not donated (the source is left as it was),
    so the donated memory bound does not apply to that call.
    """
