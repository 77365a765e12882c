"""The transport seam: the few operations the runtime needs from a group of ranks.

Everything above this interface -- the agreement, the steps of a plan, the
exchange engine and its pipeline, the memory strategies -- talks to a
:class:`Group` and never to a communication library.  MPI (mpi4py,
:mod:`mpiredist.runtime.mpi`) is one implementation; every rank as a
thread of one process (:mod:`mpiredist.runtime.threads`, for tests without
MPI) is another; a new one (torch.distributed, a device library) is one
module that subclasses :class:`Group`, as mpi4py-fft's ``NCCLTransfer``
replaces only the exchange call of its ``Transfer``.

A group is an ordered set of ranks that call its collectives together (an
MPI communicator).  Buffers are arrays of the library the run uses (numpy
or CuPy): *bytes* buffers are C-contiguous arrays whose raw memory is sent
(their dtype does not matter), *typed* buffers (reductions) are combined
elementwise by their dtype.  Counts are in bytes for bytes buffers.  Where
a collective takes ``counts``, member m's part is ``counts[m]`` bytes and
the parts lie one after another in member order.

========================== ==============================================================
operation                  meaning
========================== ==============================================================
``rank``, ``size``         this rank's index in the group, the number of ranks
``alltoall(s, r)``         equal parts: part m of ``s`` to member m, member m's into
                           part m of ``r``
``alltoallv(s, sc, r, rc)``parts of ``sc[m]`` bytes to member m, ``rc[m]`` from it
                           (each member's totals within ``count_limit``: callers
                           cut larger moves from the plan, alike on every rank)
``allgather(own, out, c)`` member m's ``c[m]`` bytes into its part of ``out``;
                           ``own`` None: this rank's part of ``out`` holds them
``allreduce(s, r, op)``    ``r = op(s over members)``; ``s`` None: in place on ``r``
``reduce_scatter(s, r, c,  member m gets ``op`` over members of part m of ``s``
op)``                      (``c[m]`` elements); ``r`` None: into the front of ``s``
``sendrecv(s, d, r, f)``   ``s`` to rank ``d`` while receiving ``r`` from rank ``f``
``isend(b, peer, sync)``   a request; ``sync``: finishes only once it is matched
``irecv(b, peer)``         a request
``wait_some(requests)``    indices of finished requests (at least one), yielding the CPU
``wait_all(requests)``     wait for every request
``split(colour, key)``     the group of the ranks with this ``colour``, ordered by
                           ``key`` (collective)
``dup()``                  a group of the same ranks whose messages never match this
                           one's (collective)
``bitwise_or(words)``      OR of a small ``uint64`` array over the ranks, in place: the
                           agreement's one reduction
``allgather_object(obj)``  every rank's small picklable ``obj``, in rank order
``nodes()``                the node of every rank (a number per rank: the lowest rank
                           on its node), collective
``abort(code)``            end every rank of the job now; never returns
``free()``                 release the group (local)
========================== ==============================================================

The collectives may return how many calls they made on the wire (a
collective that a transport carries out as point-to-point messages, such
as MPI's all-gather whose displacements pass the count limit); None
counts one.  The steps add it to their records' ``calls``.

Point-to-point messages between one pair of ranks are matched in the order
they were posted (MPI's non-overtaking rule): the pipeline of
:mod:`mpiredist.runtime.p2p` relies on it.  A message buffer is either an
array (its bytes) or a :class:`Strided` box of a larger array, which only a
transport with ``strided`` True takes (MPI's subarray datatypes); the
engine never makes one for a transport without.

Capabilities the engine reads: ``count_limit`` (bytes one message or part
may carry; the engine cuts parts within it), ``strided``, and
:meth:`Group.reduces` (dtypes the transport reduces itself; others are
combined by numpy from parts).  Every decision that changes which calls
run is made from the plan and agreed values, never from a transport's
answer on one rank alone.
"""

__all__ = ["Group", "Strided", "REDUCE_OPS", "own_into_slot"]

# The reductions of partial values, by name (the layout's op).
REDUCE_OPS = ("sum", "max", "min", "prod")


def own_into_slot(slot, own):
    """Copy ``own`` (this member's part of an all-gather, any strides, host or
    device) into ``slot``, its flat bytes in the output: the one way every
    transport places it, whatever the part's contiguity on this rank."""
    slot.view(own.dtype).reshape(own.shape)[...] = own


class Strided:
    """A box of a C-contiguous array as a message: ``base`` (the array), ``starts``
    and ``shape`` in elements (only for a transport with ``strided``)."""

    __slots__ = ("base", "starts", "shape")

    def __init__(self, base, starts, shape):
        self.base, self.starts, self.shape = base, tuple(starts), tuple(shape)

    def __repr__(self):
        return f"Strided(base{tuple(self.base.shape)}, starts={self.starts}, shape={self.shape})"


class Group:
    """An ordered set of ranks that communicate together (see the module doc).

    Subclasses set ``rank``, ``size``, ``count_limit`` and ``strided`` and
    implement the operations; ``kept`` (a dict) holds what mpiredist keeps
    for the group's lifetime (meshes' groups, Transfers of ``redistribute``).
    """

    def __init__(self):
        self.kept = {}

    name = "group"          # the transport's name, in messages
    library = "group"       # the library and its version (a machine profile records it)
    rank = 0
    size = 1
    count_limit = 1 << 62   # bytes in one message, at most
    strided = False         # takes Strided messages
    device_aware = False    # takes device (CUDA) buffers itself, on this rank
    aware_hint = ""         # what would make it take them (a line for error messages)
    errors = ()             # the transport's own exception classes (CommunicationError)

    # ------------------------------------------------------- collectives

    def alltoall(self, send, recv):
        raise NotImplementedError

    def alltoallv(self, send, send_counts, recv, recv_counts):
        raise NotImplementedError

    def allgather(self, own, out, counts):
        raise NotImplementedError

    def allreduce(self, send, recv, op):
        raise NotImplementedError

    def reduce_scatter(self, send, recv, counts, op):
        raise NotImplementedError

    def sendrecv(self, send, dest, recv, source):
        raise NotImplementedError

    def reduces(self, dtype):
        """True if :meth:`allreduce` and :meth:`reduce_scatter` take ``dtype``."""
        return False

    # ---------------------------------------------------- point to point

    def isend(self, buf, peer, sync=False):
        raise NotImplementedError

    def irecv(self, buf, peer):
        raise NotImplementedError

    def wait_some(self, requests):
        raise NotImplementedError

    def wait_all(self, requests):
        raise NotImplementedError

    # ------------------------------------------------------ structure

    def split(self, colour, key):
        raise NotImplementedError

    def dup(self):
        raise NotImplementedError

    def free(self):
        """Release the group and what is kept for it (local)."""
        found, self.kept = self.kept, {}
        for obj in list(found.values()):
            if hasattr(obj, "free"):
                obj.free()

    # ------------------------------------------- agreement and failure

    def bitwise_or(self, words):
        raise NotImplementedError

    def allgather_object(self, obj):
        raise NotImplementedError

    def nodes(self):
        """Every rank's node: the lowest rank on it (default: one node)."""
        return [0] * self.size

    def abort(self, code=1):
        raise NotImplementedError

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"
