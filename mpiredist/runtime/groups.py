"""The groups of a mesh, and what mpiredist keeps per group.

A mesh's ``comm`` is the group of ranks it lives on: ``None`` (the
process's world: MPI's ``COMM_WORLD``), an mpi4py communicator, or a
transport :class:`~mpiredist.runtime.transport.Group` (threads,
torch.distributed).  :func:`base_group` resolves it once; everything
mpiredist keeps for a group -- the meshes' groups of every sub-axis, its
own duplicate for exchanges, the nodes of its ranks, whether device
buffers may go to it (:mod:`mpiredist.runtime.devices`), the Transfers of
``redistribute`` -- lives in the
group's :attr:`~mpiredist.runtime.transport.Group.kept` dict and is freed
with it, never in module globals.

:class:`MeshGroups` owns the groups it creates and frees them in
:meth:`MeshGroups.free`.  Sub-groups are created on first use, once per
sub-axis group, and ordered so that a member's rank in the sub-group is its
mixed-radix index over the group (first sub-axis major).
"""

import os
import sys

from ..core.errors import MeshError
from ..core.subaxes import rank_digits
from ..core.topology import Topology
from . import mpi, torchdist
from .transport import Group

__all__ = ["base_group", "world_group", "as_group", "TRANSPORT_ENV", "MeshGroups", "mesh_groups",
           "library_group", "topology",
           "node_ranks", "kept", "check_size"]


def base_group(mesh):
    """The group of ``mesh`` (its ``comm``; ``None``: the world, :func:`world_group`)."""
    comm = mesh.comm
    if isinstance(comm, Group):
        return comm
    return world_group() if comm is None else as_group(comm)


TRANSPORT_ENV = "MPIREDIST_TRANSPORT"
# set by the launchers of MPI (hydra, Open MPI, PMIx): the job is an MPI job
MPI_LAUNCHED = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def world_group():
    """The group of every rank of the job (what a mesh's ``comm=None`` means):
    torch.distributed's default group when it is initialised and MPI did not
    launch the job (torchrun), else MPI's ``COMM_WORLD``;
    ``MPIREDIST_TRANSPORT=mpi`` or ``torch`` chooses.  Alike on every rank of
    a job (the launcher and the environment are)."""
    choice = os.environ.get(TRANSPORT_ENV, "").strip().lower()
    if choice == "torch" or not choice and _torch_job():
        return torchdist.world()
    return mpi.world()


def _torch_job():
    dist = sys.modules.get("torch.distributed")     # not imported here
    return (dist is not None and dist.is_available() and dist.is_initialized()
            and not any(k in os.environ for k in MPI_LAUNCHED))


def check_size(mesh, group):
    """MeshError unless ``group`` has exactly ``mesh.size`` ranks."""
    if group.size != mesh.size:
        raise MeshError(f"mesh {mesh} has {mesh.size} devices but the communicator "
                        f"has {group.size} ranks")


class MeshGroups:
    """The groups of one mesh over every rank of ``base`` (device order)."""

    def __init__(self, mesh, base):
        check_size(mesh, base)
        self.mesh = mesh
        if mesh.ranks is not None:             # device d is rank ranks[d]
            self.group = base.split(0, mesh.device_ranks().index(base.rank))
        else:
            self.group = base.dup()
        self.rank = self.group.rank
        self.digits = rank_digits(mesh, self.rank)
        self._subs = {}

    def sub(self, axes):
        """The group of the sub-axes ``axes`` (collective on first use, then kept)."""
        found = self._subs.get(axes)
        if found is None:
            colour, key = 0, 0
            for s in axes:
                key = key * s.size + self.digits[s]
            for s, d in self.digits.items():
                if s not in axes:
                    colour = colour * s.size + d
            found = self._subs[axes] = self.group.split(colour, key)
        return found

    def free(self):
        """Free every group this object created."""
        for g in self._subs.values():
            g.free()
        self._subs.clear()
        if self.group is not None:
            self.group.free()
            self.group = None

    def __repr__(self):
        return f"MeshGroups({self.mesh!r}, rank={self.rank})"


def mesh_groups(mesh):
    """The shared :class:`MeshGroups` of ``mesh`` on its group (collective on first use)."""
    base = base_group(mesh)
    key = ("mesh", mesh.axes, mesh.ranks)
    found = base.kept.get(key)
    if found is None or found.group is None:
        found = base.kept[key] = MeshGroups(mesh, base)
    return found


def library_group(base):
    """mpiredist's own duplicate of ``base`` (collective on first use, then kept).

    Exchanges over every rank of a group (between meshes, ``reshape``,
    slicing) run on it, so their messages never match a user's.
    """
    found = base.kept.get("library")
    if found is None:
        found = base.kept["library"] = base.dup()
    return found


def topology(base=None):
    """The :class:`~mpiredist.core.topology.Topology` of a group's ranks (default
    ``COMM_WORLD``'s; an mpi4py communicator is taken too): ranks on one node
    share it, nodes numbered by their lowest rank.  Collective on first use,
    then kept with the group."""
    base = as_group(base)
    found = base.kept.get("topology")
    if found is None:
        found = base.kept["topology"] = Topology(base.nodes())
    return found


def as_group(comm):
    """The group of a communicator: a Group, an mpi4py one, or None (the world)."""
    if isinstance(comm, Group):
        return comm
    if comm is None:
        return world_group()
    return mpi.group_of(comm)


def node_ranks(base):
    """How many ranks of ``base`` share this rank's node (collective on first use)."""
    t = topology(base)
    mine = t.node(base.rank)
    return sum(t.node(r) == mine for r in range(t.size))


def kept(base, name):
    """The dict ``name`` of objects with a ``free()`` that mpiredist keeps for
    ``base`` (the Transfers of :func:`mpiredist.redistribute`), bounded by its
    user with :func:`mpiredist.core.caches.recent`; local.  Its objects are
    freed with ``base``."""
    found = base.kept.get(name)
    if found is None:
        found = base.kept[name] = _Objects()
    return found


class _Objects(dict):
    """Kept objects by key, freed together."""

    def free(self):
        objects = list(self.values())
        self.clear()
        for obj in objects:
            obj.free()
