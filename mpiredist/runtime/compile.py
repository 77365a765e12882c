"""Making a Transfer: the arguments validated on every rank, agreed, and a route chosen.

Every route of the package that redistributes one array -- ``mr.Transfer``,
``mr.redistribute``, ``DistArray.redistribute``, between meshes or on one --
comes here, so that the same mistake raises the same exception with the
same message whichever route it took: the validation of each side against
its mesh is :func:`mpiredist.planning.planner.validate` and
:func:`~mpiredist.planning.planner.validate_sides`, the one decision
"between meshes?" is :func:`mpiredist.planning.crossmesh.between`, and the
checks of the runtime's own arguments are :func:`check_call`.
"""

import warnings

from ..core.errors import DonationWarning, MeshError, PlanError
from ..core.mesh import Mesh
from ..planning import planner
from ..planning.crossmesh import between, relabel, route
from .agree import check_together
from .between import BoxExchange
from .groups import as_group, base_group, check_size, topology
from .inputs import check_workspace
from .onemesh import OneMesh

__all__ = ["compile_transfer", "transfer_of_plan", "check_call", "check_options",
           "target_of"]


def target_of(mesh, dst_mesh):
    """The target mesh (``mesh`` when None); MeshError unless both meshes live
    on one communicator."""
    target = mesh if dst_mesh is None else (
        dst_mesh if isinstance(dst_mesh, Mesh) else Mesh(dst_mesh))
    if not _same_comm(mesh.comm, target.comm):
        raise MeshError(f"target mesh {target} is on another communicator than the "
                        f"source mesh {mesh}; both meshes must live on one communicator")
    return target


def _same_comm(a, b):
    """True if ``a`` and ``b`` are one communicator (None: the world)."""
    return a is b or as_group(a) is as_group(b)


def check_options(donate, checked):
    """PlanError for a donation without checked runs."""
    if donate and not checked:
        raise PlanError("Transfer(donate=True, checked=False): whether a block can be "
                        "donated is agreed by every rank on each run; donation needs "
                        "checked runs")


def check_call(strategy, workspace, donate, checked):
    """The runtime's own arguments of a redistribution: ``(workspace,)`` checked."""
    if strategy not in planner.STRATEGIES:
        raise PlanError(f"strategy {strategy!r} is not one of {planner.STRATEGIES}")
    w = check_workspace(workspace)
    check_options(donate, checked)
    return w


def compile_transfer(global_shape, dtype, mesh, src, dst, donate, workspace, strategy, checked,
                     dst_mesh):
    """How a Transfer of these arguments moves the data (collective; see
    :class:`~mpiredist.Transfer`): a :class:`~mpiredist.runtime.onemesh.OneMesh`
    or a :class:`~mpiredist.runtime.between.BoxExchange`."""
    def body(mesh, rank):
        group = base_group(mesh)
        target = target_of(mesh, dst_mesh)
        w = check_call(strategy, workspace, donate, checked)
        if not between(mesh, dst_mesh, group.size):
            plan = planner.plan(global_shape, dtype, mesh, src, dst, strategy)
            check_size(mesh, group)
            return (None, plan, w), dict(
                mesh=mesh, shape=plan.global_shape, dtype=plan.dtype, src=plan.src,
                dst=plan.dst, strategy=strategy, donate=bool(donate), workspace=w,
                checked=bool(checked))
        shape, dt, mesh, s, target, d = planner.validate_sides(global_shape, dtype, mesh, src,
                                                                target, dst, group.size)
        if target.auto:         # ordered after the agreement, by the nodes (collective)
            relabel(shape, mesh, s, target, d, group.size)        # raises as it will then
        found = None if target.auto else _route(shape, dt, mesh, s, target, d, group.size,
                                                strategy)
        return ((target, shape, dt, s, d, found), None, w), dict(
            mesh=repr(mesh), dst_mesh=repr(target), shape=shape, dtype=dt, src=s, dst=d,
            workspace=w, strategy=strategy, donate=bool(donate), checked=bool(checked))

    mesh, (crossing, plan, w) = check_together("Transfer", mesh, body)
    if crossing is None:
        return OneMesh(mesh, plan, bool(donate), w, bool(checked), replan=True)
    target, shape, dt, s, d, found = crossing
    if target.auto:             # alike on every rank: agreed values, the agreed nodes
        group = base_group(mesh)
        target = relabel(shape, mesh, s, target, d, group.size, topology(group))
        found = _route(shape, dt, mesh, s, target, d, group.size, strategy)
    if found is not None:
        refined, plan = found
        return OneMesh(refined, plan, bool(donate), w, bool(checked), target,
                                  replan=True, dst_layout=d)
    if donate:
        warnings.warn(DonationWarning(
            f"Transfer between meshes {mesh} and {target}: the exchange reads the source "
            "block in place, so a donation is not honoured on this route"), stacklevel=4)
    return BoxExchange.between_meshes(mesh, target, shape, dt, s, d, w, bool(checked))


def _route(shape, dtype, mesh, src, target, dst, size, strategy):
    """``(refined mesh, its Plan)`` if the meshes nest, else None (an exchange)."""
    found = route(mesh, src, target, dst, size)
    if found is None:
        return None
    return found[0], planner.plan(shape, dtype, found[0], found[1], found[2], strategy)


def transfer_of_plan(plan, mesh, donate, workspace, checked, executor):
    """The :class:`~mpiredist.runtime.onemesh.OneMesh` that runs ``plan`` on ``mesh``
    (collective: the ranks agree on the plan); see :meth:`Transfer.from_plan
    <mpiredist.Transfer.from_plan>`."""
    if executor not in (None, "in place"):
        raise PlanError(f"executor {executor!r} is not None or 'in place'")

    def body(mesh, rank):
        check_size(mesh, base_group(mesh))
        if mesh.axes != plan.mesh.axes:
            raise MeshError(f"plan on mesh {plan.mesh} given mesh {mesh}")
        # the plan is given: its strategy names how it was made (XLA's plans
        # too), not a choice of the planner's to check
        w = check_workspace(workspace)
        check_options(donate, checked)
        return w, dict(plan=repr(plan.steps), mesh=repr(mesh), shape=plan.global_shape,
                       dtype=plan.dtype, donate=bool(donate), workspace=w, executor=executor)

    mesh, w = check_together("Transfer.from_plan", mesh, body)
    return OneMesh(mesh, plan, bool(donate), w, bool(checked),
                              in_place=executor == "in place")
