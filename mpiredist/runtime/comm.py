"""MPI communicators for a mesh: one Cartesian communicator, sub-communicators.

:class:`MeshComm` owns every MPI object it creates and frees them in
:meth:`MeshComm.free` (or on leaving a ``with`` block), never in ``__del__``.
Sub-communicators are created on first use, once per sub-axis group, and
ordered so that a member's rank in the sub-communicator is its mixed-radix
index over the group (first sub-axis major).
"""

import ctypes
import os
import sys

import numpy as np

from ..core import mesh as _mesh
from ..core.errors import MeshError
from ..core.topology import Topology
from ..core.subaxes import rank_digits

__all__ = ["MeshComm", "mpi", "mesh_comm", "library_comm", "node_comm", "topology",
           "kept", "check_size", "base_comm", "free_all", "cuda_aware", "gpu_support"]


def mpi():
    """Import ``mpi4py.MPI`` or raise ImportError with how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError("mpi4py is required to run plans: pip install mpi4py "
                          "(or mpiredist[mpich] for a self-contained MPICH)") from exc
    return MPI


def base_comm(mesh):
    """The communicator of ``mesh``: its own, or ``MPI.COMM_WORLD``."""
    return mesh.comm if mesh.comm is not None else mpi().COMM_WORLD


def check_size(mesh, comm):
    """MeshError unless ``comm`` has exactly ``mesh.size`` ranks."""
    if comm.Get_size() != mesh.size:
        raise MeshError(f"mesh {mesh} has {mesh.size} devices but the communicator "
                        f"has {comm.Get_size()} ranks")


class MeshComm:
    """The communicators of one mesh.

    Parameters
    ----------
    mesh : Mesh
        Its ``comm`` (or ``MPI.COMM_WORLD``) must have ``mesh.size`` ranks;
        this is checked on every rank, and every rank raises together.  A
        mesh over every rank in another order (``ranks``) gets a
        communicator in its device order first.
    """

    def __init__(self, mesh):
        MPI = mpi()
        base = mesh.comm if mesh.comm is not None else MPI.COMM_WORLD
        check_size(mesh, base)
        self.mesh = mesh
        ordered = None
        if mesh.ranks is not None:             # device d is rank ranks[d]
            ordered = base.Split(0, mesh.device_ranks().index(base.Get_rank()))
            base = ordered
        if mesh.axes:
            self.comm = base.Create_cart(list(mesh.sizes), periods=[False] * len(mesh.axes),
                                         reorder=False)
        else:
            self.comm = base.Dup()
        if ordered is not None:
            ordered.Free()
        self.rank = self.comm.Get_rank()
        self.digits = rank_digits(mesh, self.rank)
        self._subs = {}

    def sub(self, group):
        """The sub-communicator over the sub-axes ``group`` (collective, cached)."""
        group = tuple(group)
        if group not in self._subs:
            colour, key = 0, 0
            for s in group:
                key = key * s.size + self.digits[s]
            for s, d in self.digits.items():
                if s not in group:
                    colour = colour * s.size + d
            self._subs[group] = self.comm.Split(colour, key)
        return self._subs[group]

    def free(self):
        """Free every communicator this object created."""
        for c in self._subs.values():
            c.Free()
        self._subs.clear()
        if self.comm is not None:
            self.comm.Free()
            self.comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __repr__(self):
        return f"MeshComm({self.mesh!r}, rank={self.rank})"


_KEYVAL = []       # the MPI attribute key under which meshes are cached
_CACHED = []       # communicators that carry a cache, for free_all()


class _Cache(dict):
    """What mpiredist keeps for one communicator, held as its MPI attribute;
    everything in it is freed when the communicator is (or by :func:`free_all`).

    The attribute has no Python delete callback: freeing the communicator
    drops mpi4py's reference to this dict, and that frees its contents.  A
    delete callback would have mpi4py wrap the handle being freed (which
    calls ``MPI_Topo_test``); under MPICH that walks the communicator's
    attribute list while the entries ahead of this one are already freed,
    and crashed whenever an attribute set after mpiredist's (a user's,
    mpi4py's own) was freed at the end of a block of MPICH's attribute
    pool.  Freeing other communicators from here is what MPI allows.
    """

    __slots__ = ()

    def __del__(self):
        MPI = sys.modules.get("mpi4py.MPI")    # no import: this may run at exit
        if MPI is None or MPI.Is_finalized():  # kept past MPI_Finalize: nothing to free
            return
        self.release()

    def release(self):
        """Free everything held (once; :func:`free_all` calls it before deleting
        the attribute, in case another reference, such as a kept traceback
        that holds an accessor's frame, delays ``__del__``)."""
        for objects in self.pop(KEPT, {}).values():
            for obj in objects.values():
                obj.free()
        for key, mc in self.items():
            if key in (TOPOLOGY, GPU):
                continue
            if key in (LIBRARY, NODE):
                mc.Free()
            elif mc.comm is not None:
                mc.free()
        self.clear()


LIBRARY = "library"     # the cache key of library_comm's communicator
KEPT = "kept"           # the cache key of the dicts of kept()


def _keyval():
    if not _KEYVAL:
        _KEYVAL.append(mpi().Comm.Create_keyval())      # no delete_fn: see _Cache
    return _KEYVAL[0]


def _cache(base):
    cache = base.Get_attr(_keyval())
    if cache is None:
        cache = _Cache()
        base.Set_attr(_keyval(), cache)
        # a communicator freed since (its handle now null) is dropped here, so
        # that this list does not keep every communicator ever used alive
        null = mpi().COMM_NULL
        _CACHED[:] = [c for c in _CACHED if c != null]
        _CACHED.append(base)
    return cache


def library_comm(base):
    """mpiredist's own duplicate of ``base`` (collective on first use, then cached).

    Point-to-point exchanges over every rank of a communicator (between
    meshes, ``reshape``, slicing) run on it, so their messages never match
    a user's receives on ``base``; it is freed with ``base``.
    """
    cache = _cache(base)
    found = cache.get(LIBRARY)
    if found is None:
        found = cache[LIBRARY] = base.Dup()
    return found


NODE = "node"          # the cache key of node_comm's communicator


def node_comm(base):
    """The ranks of ``base`` that share this rank's node (``Split_type`` with
    ``COMM_TYPE_SHARED``; collective on first use, then cached, freed with
    ``base``)."""
    cache = _cache(base)
    found = cache.get(NODE)
    if found is None:
        found = cache[NODE] = base.Split_type(mpi().COMM_TYPE_SHARED)
    return found


TOPOLOGY = "topology"  # the cache key of topology's Topology


def topology(base=None):
    """The :class:`~mpiredist.core.topology.Topology` of a communicator's ranks
    (default ``COMM_WORLD``): ranks that share memory (``Split_type`` with
    ``COMM_TYPE_SHARED``) share a node, nodes numbered by their lowest rank.
    Collective on first use (one allgather), then cached with the
    communicator."""
    base = mpi().COMM_WORLD if base is None else base
    cache = _cache(base)
    found = cache.get(TOPOLOGY)
    if found is None:
        # buffer collectives: they are cheaper than mpi4py's object reductions,
        # which would also add an attribute of their own to base
        mine = np.array([base.Get_rank()], dtype=np.int64)
        leader = np.empty(1, dtype=np.int64)
        node_comm(base).Allreduce(mine, leader, op=mpi().MIN)
        leaders = np.empty(base.Get_size(), dtype=np.int64)
        base.Allgather(leader, leaders)
        found = cache[TOPOLOGY] = Topology(leaders.tolist())
    return found


GPU = "gpu"            # the cache key of gpu_support's answer
AWARE_ENV, STAGING_ENV = "MPIREDIST_GPU_AWARE", "MPIREDIST_GPU_STAGING"


def cuda_aware():
    """This process's MPI library takes CUDA device pointers: ``MPIREDIST_GPU_AWARE``
    (0 or 1) when set, else ``MPIX_Query_cuda_support()`` of the loaded
    library (Open MPI and MPICH have it; mpi4py does not expose it, so it is
    looked up with ctypes), else False."""
    value = os.environ.get(AWARE_ENV, "").strip()
    if value:
        return value not in ("0", "false", "no")
    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({line.split()[-1] for line in maps if "/libmpi" in line})
    except OSError:
        libs = []
    for path in libs or [None]:
        try:
            query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support", None)
        except OSError:
            continue
        if query is not None:
            query.restype = ctypes.c_int
            return bool(query())
    return False


def gpu_support(base):
    """``(aware, staging)`` for device arrays on ``base``, agreed by its ranks
    (collective on first use: one Allreduce, then cached with ``base``).

    ``aware``: every rank's MPI is CUDA-aware (:func:`cuda_aware`), so device
    buffers go to MPI directly; ``staging``: no rank forbids staging device
    arrays through host memory (``MPIREDIST_GPU_STAGING=0`` forbids it).
    """
    cache = _cache(base)
    found = cache.get(GPU)
    if found is None:
        staging = os.environ.get(STAGING_ENV, "").strip() not in ("0", "false", "no")
        mine = np.array([cuda_aware(), staging], dtype=np.int64)
        agreed = np.empty(2, dtype=np.int64)
        base.Allreduce(mine, agreed, op=mpi().MIN)
        found = cache[GPU] = (bool(agreed[0]), bool(agreed[1]))
    return found


def kept(base, name):
    """The dict ``name`` of objects with a ``free()`` that mpiredist keeps for
    ``base`` (the Transfers of :func:`mpiredist.redistribute`, the exchanges
    of the DTensor and HeAT entry points), bounded by its user with
    :func:`mpiredist.core.caches.recent`; local, no communication.  Its
    objects are freed with ``base``, so an object made for one communicator
    is never found for another."""
    return _cache(base).setdefault(KEPT, {}).setdefault(name, {})


def mesh_comm(mesh):
    """The shared :class:`MeshComm` of ``mesh`` on its communicator.

    Cached as an MPI attribute of the communicator (as MPI intends for
    library state), so it is created once per communicator and mesh, and
    freed when the communicator is freed (or by :func:`free_all`).
    """
    cache = _cache(base_comm(mesh))
    key = (mesh.axes, mesh.ranks)
    found = cache.get(key)
    if found is None or found.comm is None:
        found = cache[key] = MeshComm(mesh)
    return found


def free_all():
    """Free the communicators of every mesh :func:`mesh_comm` created."""
    while _CACHED:
        base = _CACHED.pop()
        cache = None if base == mpi().COMM_NULL else base.Get_attr(_keyval())
        if cache is not None:
            cache.release()
            base.Delete_attr(_keyval())


def _mesh_topology(comm):
    return topology(comm)


# Mesh.hybrid finds a communicator's topology through this (core cannot
# import the runtime).
_mesh.set_topology_source(_mesh_topology)
