"""MPI as a transport: :class:`MpiGroup`, the only module that imports mpi4py.

:class:`MpiGroup` implements :class:`~mpiredist.runtime.transport.Group` on an
mpi4py communicator, for any message size: MPI-3 libraries (Open MPI 5
among them) take counts and displacements as C ``int``, and only MPI-4
added the large-count calls that mpi4py uses where the library has them
(MPICH 4 and later), so no call here gets a count or a displacement above
:attr:`MpiGroup.count_limit` in its own units:

- a run of bytes longer than the limit goes as one element of a contiguous
  datatype of that length (mpi4py builds it BigMPI's way on MPI-3
  libraries);
- an all-gather whose displacements pass the limit goes as point-to-point
  messages;
- a :class:`~mpiredist.runtime.transport.Strided` message is a subarray
  datatype, freed as soon as the call is posted (MPI lets pending calls
  finish with a freed datatype).

``MPIREDIST_COUNT_LIMIT`` (bytes) lowers the limit, e.g. to exercise these
paths with small arrays in tests; it must be the same on every rank, like
the MPI library itself.

The groups of a user's communicator are found through :func:`group_of`,
kept as an MPI attribute of that communicator (as MPI intends for library
state) and freed with it; :func:`world` is ``COMM_WORLD``'s.  Device
(CuPy) buffers are handed to MPI as they are where the library is
CUDA-aware (:func:`cuda_aware`), after the current stream has finished
writing them.
"""

import ctypes
import os
import sys
import weakref

import numpy as np

from ..core.backend import is_gpu, synchronize
from ..core.blocks import offsets
from ..planning.planner import mpi_reduces
from .transport import Group, Strided, own_into_slot

__all__ = ["mpi", "MpiGroup", "group_of", "world", "free_all", "cuda_aware", "cuda_aware_hint",
           "count_limit", "INT_MAX", "LIMIT_ENV", "AWARE_ENV"]

INT_MAX = (1 << 31) - 1
LIMIT_ENV = "MPIREDIST_COUNT_LIMIT"
AWARE_ENV = "MPIREDIST_GPU_AWARE"
TAG = 0x6d72            # "mr": one tag for every message of a move; order is MPI's
GATHER_TAG = 7


def mpi():
    """Import ``mpi4py.MPI`` or raise ImportError with how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError("mpi4py is required to run over MPI: pip install mpi4py (or "
                          "mpiredist[mpich] for a self-contained MPICH); under torchrun, "
                          "call torch.distributed.init_process_group first and mpiredist "
                          "runs over torch.distributed (mr.torch.mesh makes a mesh of a "
                          "DeviceMesh)") from exc
    return MPI


def count_limit(MPI):
    """The largest count or displacement one MPI call may carry, in its units."""
    value = os.environ.get(LIMIT_ENV, "").strip()
    if value:
        return max(1, int(value))
    return (1 << 62) if MPI.Get_version() >= (4, 0) else INT_MAX


def _flat(array):
    """The memory of a C-contiguous array as flat bytes (a view)."""
    return array.reshape(-1).view(np.uint8)


class MpiGroup(Group):
    """An mpi4py communicator as a :class:`~mpiredist.runtime.transport.Group`.

    ``owned``: the group made the communicator (a split or a duplicate) and
    frees it in :meth:`free`; a user's communicator is never freed here.
    """

    name = "MPI"
    strided = True

    def __init__(self, comm, owned=False):
        super().__init__()
        MPI = mpi()
        self.MPI, self.comm, self.owned = MPI, comm, owned
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._limit = (None, INT_MAX)          # (MPIREDIST_COUNT_LIMIT as read, the limit)
        self.errors = (MPI.Exception,)
        self.library = MPI.Get_library_version().splitlines()[0].strip()
        self.BYTE = MPI.BYTE
        self._elements = {}         # itemsize -> committed contiguous datatype

    @property
    def count_limit(self):
        """The largest count one call takes (:func:`count_limit`; the variable is
        read again when it changes: tests lower it between Transfers)."""
        value = os.environ.get(LIMIT_ENV)
        if value != self._limit[0]:
            self._limit = (value, count_limit(self.MPI))
        return self._limit[1]

    # ---------------------------------------------------------- messages

    def _message(self, buf):
        """``(spec, datatypes to free once posted)`` of an array or a Strided box."""
        if type(buf) is Strided:
            base = buf.base
            if not base.ndim:
                return [base, 1, self._element(base.itemsize)], ()
            t = self._element(base.itemsize).Create_subarray(
                list(base.shape), list(buf.shape), list(buf.starts)).Commit()
            return [base, 1, t], (t,)
        if is_gpu(buf):
            synchronize(buf)
        n = buf.nbytes
        if n <= self.count_limit:
            return [buf, n, self.BYTE], ()
        t = self.BYTE.Create_contiguous(n).Commit()
        return [_flat(buf), 1, t], (t,)

    def _element(self, itemsize):
        found = self._elements.get(itemsize)
        if found is None:
            found = self._elements[itemsize] = self.BYTE.Create_contiguous(itemsize).Commit()
        return found

    def _unit(self, nbytes):
        """``(count, datatype)`` of ``nbytes`` bytes and what to free after."""
        if nbytes <= self.count_limit:
            return (nbytes, self.BYTE), ()
        t = self.BYTE.Create_contiguous(nbytes).Commit()
        return (1, t), (t,)

    @staticmethod
    def _free(types):
        for t in types:
            t.Free()

    # ------------------------------------------------------- collectives

    def alltoall(self, send, recv):
        unit = send.nbytes // self.size
        if type(send) is not np.ndarray:
            self._ready(send, recv)
        if unit <= self.count_limit:
            self.comm.Alltoall([send, unit, self.BYTE], [recv, unit, self.BYTE])
            return
        (count, t), types = self._unit(unit)
        self.comm.Alltoall([send, count, t], [recv, count, t])
        self._free(types)

    def alltoallv(self, send, send_counts, recv, recv_counts):
        self._ready(send, recv)
        if sum(send_counts) > self.count_limit or sum(recv_counts) > self.count_limit:
            # the caller keeps every member's totals within the limit, from
            # the plan (steps.one_call, the group's buckets): a rank that
            # chose messages here alone would leave the others in Alltoallv
            raise AssertionError(f"internal error: alltoallv of {sum(send_counts)} and "
                                 f"{sum(recv_counts)} bytes past the count limit "
                                 f"{self.count_limit}")
        B = self.BYTE
        self.comm.Alltoallv([send, send_counts, offsets(send_counts), B],
                            [recv, recv_counts, offsets(recv_counts), B])

    def _messages(self, sends, recvs):
        """``(peer, array)`` messages of their own, posted together, waited for;
        returns how many were posted (the calls of a collective that went so)."""
        requests, types = [], []
        for post, pairs in ((self.comm.Irecv, recvs), (self.comm.Isend, sends)):
            for peer, view in pairs:
                spec, made = self._message(view)
                requests.append(post(spec, peer, GATHER_TAG))
                types.extend(made)
        self.MPI.Request.Waitall(requests)
        self._free(types)
        return len(requests)

    def allgather(self, own, out, counts):
        MPI, me = self.MPI, self.rank
        at = offsets(counts)
        even = len(set(counts)) == 1
        fits = at[-1] + counts[-1] <= self.count_limit
        if own is not None:
            # into this rank's slot first, then in place on every rank: MPI
            # wants MPI_IN_PLACE at all ranks or none, and whether ``own`` is
            # contiguous is this rank's own (uneven blocks); MPI would copy
            # the send buffer into the slot itself
            own_into_slot(_flat(out)[at[me]:at[me] + counts[me]], own)
        send = MPI.IN_PLACE
        self._ready(out)
        if even:
            (count, t), more = self._unit(counts[0])
            self.comm.Allgather(send, [out, count, t])
            self._free(more)
        elif fits:
            self.comm.Allgatherv(send, [out, counts, at, self.BYTE])
        else:                               # displacements past the limit: messages
            flat = _flat(out)
            mine = flat[at[me]:at[me] + counts[me]]
            return self._messages(
                [(p, mine) for p in range(self.size) if p != me and counts[me]],
                [(p, flat[at[p]:at[p] + counts[p]]) for p in range(self.size)
                 if p != me and counts[p]])
        return 1

    def allreduce(self, send, recv, op):
        t = self._typed(recv)
        self._ready(recv) if send is None else self._ready(send, recv)
        self.comm.Allreduce(self.MPI.IN_PLACE if send is None else [send, t], [recv, t],
                            self._op(op, recv.dtype))

    def reduce_scatter(self, send, recv, counts, op):
        t = self._typed(send)
        self._ready(send)
        if recv is None:
            self.comm.Reduce_scatter(self.MPI.IN_PLACE, [send, sum(counts), t], counts,
                                     self._op(op, send.dtype))
        else:
            self.comm.Reduce_scatter([send, t], [recv, t], counts, self._op(op, send.dtype))

    def sendrecv(self, send, dest, recv, source):
        spec, types = self._message(send)
        into, more = self._message(recv)
        self.comm.Sendrecv(spec, dest, recvbuf=into, source=source)
        self._free(types)
        self._free(more)

    def reduces(self, dtype):
        return mpi_reduces(np.dtype(dtype))

    def _typed(self, array):
        """The predefined MPI datatype of an array's dtype (``Datatype.fromcode``:
        mpi4py's ``dtlib.from_numpy_dtype`` returns a duplicate, which MPICH
        refuses in reductions)."""
        return self.MPI.Datatype.fromcode(np.dtype(array.dtype).char)

    def _op(self, op, dtype):
        MPI = self.MPI
        if np.dtype(dtype) == np.bool_:
            return {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND, "prod": MPI.LAND}[op]
        return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}[op]

    @staticmethod
    def _ready(*arrays):
        for a in arrays:
            if a is not None and is_gpu(a):
                synchronize(a)

    # ---------------------------------------------------- point to point

    def isend(self, buf, peer, sync=False):
        spec, types = self._message(buf)
        request = (self.comm.Issend if sync else self.comm.Isend)(spec, peer, TAG)
        if types:
            self._free(types)
        return request

    def irecv(self, buf, peer):
        spec, types = self._message(buf)
        request = self.comm.Irecv(spec, peer, TAG)
        if types:
            self._free(types)
        return request

    def wait_some(self, requests):
        """Indices of finished requests, yielding the CPU between tests.

        Not ``Waitsome``: MPICH's ``Waitsome`` and ``Waitany`` do not yield
        while they poll, and with more ranks than cores the spinning ranks
        starve the ones they wait for (c01 at 8 ranks on 2 cores: 42 ms with
        ``Waitsome``, 7.7 ms with this loop).
        """
        testsome = self.MPI.Request.Testsome
        while True:
            done = testsome(requests)
            if done:
                return done
            os.sched_yield()

    def wait_all(self, requests):
        self.MPI.Request.Waitall(requests)

    # ------------------------------------------------------- structure

    def split(self, colour, key):
        return MpiGroup(self.comm.Split(colour, key), owned=True)

    def dup(self):
        return MpiGroup(self.comm.Dup(), owned=True)

    def free(self):
        super().free()
        for t in self._elements.values():
            t.Free()
        self._elements.clear()
        if self.owned and self.comm is not None and not self.MPI.Is_finalized():
            self.comm.Free()
        self.comm = None

    # -------------------------------------------- agreement and failure

    def bitwise_or(self, words):
        self.comm.Allreduce(self.MPI.IN_PLACE, words, op=self.MPI.BOR)

    def allgather_object(self, obj):
        return self.comm.allgather(obj)

    def nodes(self):
        """Ranks that share memory (``Split_type`` with ``COMM_TYPE_SHARED``)
        share a node, numbered by their lowest rank: buffer collectives, which
        are cheaper than mpi4py's object reductions."""
        node = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)
        try:
            mine = np.array([self.rank], dtype=np.int64)
            leader = np.empty(1, dtype=np.int64)
            node.Allreduce(mine, leader, op=self.MPI.MIN)
        finally:
            node.Free()
        leaders = np.empty(self.size, dtype=np.int64)
        self.comm.Allgather(leader, leaders)
        return leaders.tolist()

    def abort(self, code=1):
        self.comm.Abort(code)
        # MPICH 5's MPI_Abort can return once it has told the launcher (in 19 of
        # 36 aborted 4-rank jobs here Python ran on until the launcher's kill):
        # end this rank now, so that no code runs after the job was aborted.
        os._exit(code)

    @property
    def device_aware(self):
        return cuda_aware()

    @property
    def aware_hint(self):
        """What would make the library take device buffers (:func:`cuda_aware_hint`)."""
        return cuda_aware_hint()


# ------------------------------------------------------------ user communicators

_KEYVAL = []        # the MPI attribute key under which groups are kept
_CACHED = []        # communicators that carry one, for free_all()
_WORLD = []         # COMM_WORLD's group


class _Cache(dict):
    """What mpiredist keeps for one user communicator, held as its MPI attribute;
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
        the attribute, in case another reference delays ``__del__``); the
        user's communicator itself is not freed."""
        kept = [v for k, v in self.items() if k is not _Cache and hasattr(v, "free")]
        self.clear()
        for obj in kept:
            obj.free()


def _keyval():
    if not _KEYVAL:
        _KEYVAL.append(mpi().Comm.Create_keyval())      # no delete_fn: see _Cache
    return _KEYVAL[0]


def group_of(comm):
    """The :class:`MpiGroup` of a user's mpi4py communicator (made on first use,
    kept as the communicator's attribute, freed with it; local)."""
    if comm is None:
        return world()
    if isinstance(comm, MpiGroup):
        return comm
    cache = comm.Get_attr(_keyval())
    if cache is None:
        cache = _Cache()
        comm.Set_attr(_keyval(), cache)
        # a communicator freed since (its handle now null) is dropped here, so
        # that this list does not keep every communicator ever used alive
        null = mpi().COMM_NULL
        _CACHED[:] = [c for c in _CACHED if c != null]
        _CACHED.append(comm)
    ref = cache.get(_Cache)
    found = None if ref is None else ref()
    if found is None:
        # what is kept for the group lives in the attribute; the attribute holds
        # the group weakly, so that freeing the communicator frees what is kept
        # at once (a strong reference back would make a cycle, freed only by the
        # garbage collector, later)
        found = MpiGroup(comm)
        found.kept = cache
        cache[_Cache] = weakref.ref(found)
    return found


def world():
    """The group of ``MPI.COMM_WORLD`` (made on first use)."""
    if not _WORLD:
        _WORLD.append(group_of(mpi().COMM_WORLD))
    return _WORLD[0]


def free_all():
    """Free what mpiredist keeps for every communicator it has seen."""
    _WORLD.clear()
    while _CACHED:
        comm = _CACHED.pop()
        cache = None if comm == mpi().COMM_NULL else comm.Get_attr(_keyval())
        if cache is not None:
            cache.pop(_Cache, None)
            cache.release()
            comm.Delete_attr(_keyval())


def cuda_aware():
    """This process's MPI library takes CUDA device pointers: ``MPIREDIST_GPU_AWARE``
    (0 or 1) when set, else ``MPIX_Query_cuda_support()`` of the loaded
    library (Open MPI, MPICH and Intel MPI have it; mpi4py does not expose
    it, so it is looked up with ctypes), else False.  Intel MPI answers 1
    only when its GPU layer started: ``I_MPI_OFFLOAD=1`` (and
    ``I_MPI_OFFLOAD_MODE=cuda`` on NVIDIA) set before MPI starts
    (:func:`cuda_aware_hint`)."""
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


def cuda_aware_hint():
    """What would make this MPI library take device buffers, as one line, or
    ``""``: Intel MPI's offload settings where it runs without them (mpiredist
    never sets them itself: they must be there before ``MPI_Init``, and
    without a GPU they make it fail)."""
    if os.environ.get("I_MPI_OFFLOAD", "").strip() in ("1", "yes", "on", "enable"):
        return ""
    try:
        version = mpi().Get_library_version()
    except ImportError:
        return ""
    if "Intel" not in version:
        return ""
    return ("Intel MPI takes CUDA buffers with I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda set "
            "before the job starts")
