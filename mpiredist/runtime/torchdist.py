"""torch.distributed as a transport: :class:`TorchGroup`, for runs under torchrun.

The same plans, exchanges and groups that run over MPI run over a
torch.distributed process group (gloo on CPU tensors, NCCL on CUDA
tensors), with no MPI library installed: a mesh whose ``comm`` is a
:class:`TorchGroup` (:func:`mpiredist.torch.mesh` makes one from a
``DeviceMesh``; :func:`world` is the default group's).  torch is imported
only here, when a group is made.

How each operation is done, and why (measured on gloo, torch 2.13):

================== ========================================================
``alltoall(v)``    ``all_to_all_single`` (with split sizes): no temporary
``allgather``      NCCL: ``all_gather_single`` of equal parts; gloo:
                   one ``broadcast`` per member into its slot, since gloo's
                   all-gather allocates a temporary of the whole output
``allreduce``      ``all_reduce`` in place (the operand copied in first)
``reduce_scatter`` ``reduce_scatter_single`` of equal parts (gloo clones the
                   operand: it is within the reduction room); unequal parts
                   by an ``all_reduce`` of a copy
``sendrecv``,      ``batch_isend_irecv`` of the posted operations when the
``isend``,         run waits (NCCL needs both directions of a pair in one
``irecv``          batch); a gloo request completes only once its ``wait()``
                   is called, so each is waited on by a thread of a small
                   pool and ``wait_some`` returns whichever finish first
``split``, ``dup`` ``new_group(..., use_local_synchronization=True)``: only
                   the members make a group, named by its ranks; the
                   DeviceMesh's own groups are taken where the members match
``bitwise_or``     gloo: ``all_reduce`` BOR of the words as int64; NCCL
                   (no bitwise reductions): an all-gather and OR here
``abort``          the process exits: torchrun's agent ends the others, and
                   peers inside a gloo collective fail at once
================== ========================================================

Messages between one pair of ranks are matched in posting order (gloo and
NCCL keep it without tags).  Buffers are numpy arrays (viewed as CPU
tensors, no copy) or CuPy arrays (as CUDA tensors, no copy); bytes buffers
go as ``uint8``.
"""

import concurrent.futures
import os
import socket
import warnings

import numpy as np

from ..core.backend import is_gpu
from .transport import Group, own_into_slot

__all__ = ["TorchGroup", "world", "as_tensor"]

POOL_THREADS = 72       # waiters of gloo requests: every part in flight (2 x 32) and more
_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "prod": "PRODUCT"}
_LOGICAL = {"sum": "MAX", "max": "MAX", "min": "MIN", "prod": "MIN"}   # bool as 0/1
# dtypes whose reductions every backend does on the tensor itself (gloo refuses
# uint16/32/64; numpy combines those, and bfloat16 held as ml_dtypes, from parts)
_REDUCES = "?bBhilqfdFD"


def _torch():
    import torch
    import torch.distributed as dist
    return torch, dist


def as_tensor(array):
    """A torch tensor over the memory of a numpy or CuPy array (no copy)."""
    torch, _ = _torch()
    if is_gpu(array):
        return torch.as_tensor(array, device="cuda")
    if not array.flags.writeable:       # a send from a read-only view: torch warns
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    return torch.from_numpy(array)


def _bytes(array):
    """``array``'s memory as a flat uint8 tensor."""
    return as_tensor(array.reshape(-1).view(np.uint8))


class _Request:
    """A posted operation: its batch entry, then its ``Work`` and waiter."""

    __slots__ = ("op", "work", "future")

    def __init__(self, op):
        self.op, self.work, self.future = op, None, None


class TorchGroup(Group):
    """A torch.distributed process group as a :class:`~mpiredist.runtime.transport.Group`.

    ``pg``: the process group (None: the default one, every rank of the
    job); ``owned``: made here (freed by :meth:`free`); ``known``: process
    groups by their global ranks that :meth:`split` takes instead of making
    new ones (a DeviceMesh's).
    """

    name = "torch.distributed"
    strided = False

    def __init__(self, pg=None, owned=False, known=None):
        super().__init__()
        torch, dist = _torch()
        self.torch, self.dist, self.pg, self.owned = torch, dist, pg, owned
        self.rank, self.size = dist.get_rank(pg), dist.get_world_size(pg)
        self.ranks = dist.get_process_group_ranks(pg) if pg is not None \
            else list(range(self.size))
        self.backend = str(dist.get_backend(pg)).lower()
        self.device_aware = self.backend == "nccl"
        self.library = f"torch {torch.__version__} ({self.backend})"
        self.errors = (dist.DistError,) if hasattr(dist, "DistError") else ()
        self.known = {} if known is None else known
        # the names of torch 2.13 (the older ones warn there), else the older ones
        self._all_gather = getattr(dist, "all_gather_single", None) or \
            dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or \
            dist.reduce_scatter_tensor
        self._pending = []      # operations posted since the last wait
        self._pool = None       # waiters of gloo requests

    # ------------------------------------------------------------ helpers

    def _op(self, op, dtype):
        table = _LOGICAL if np.dtype(dtype) == np.bool_ else _OPS
        return getattr(self.dist.ReduceOp, table[op])

    def _global(self, peer):
        return self.ranks[peer]

    # ------------------------------------------------------- collectives

    def alltoall(self, send, recv):
        self.dist.all_to_all_single(_bytes(recv), _bytes(send), group=self.pg)

    def alltoallv(self, send, send_counts, recv, recv_counts):
        self.dist.all_to_all_single(_bytes(recv), _bytes(send), list(recv_counts),
                                    list(send_counts), group=self.pg)

    def allgather(self, own, out, counts):
        flat = out.reshape(-1).view(np.uint8)
        at = np.cumsum([0] + list(counts))
        me = self.rank
        slot = flat[at[me]:at[me + 1]]
        if own is not None and counts[me]:
            own_into_slot(slot, own)        # host or device alike (CuPy under NCCL)
        if self.backend == "nccl" and len(set(counts)) == 1:
            self._all_gather(_bytes(flat), _bytes(slot), group=self.pg)
            return
        for m in range(self.size):          # gloo: no temporary of the whole output
            if counts[m]:
                self.dist.broadcast(_bytes(flat[at[m]:at[m + 1]]), self._global(m),
                                    group=self.pg)

    def allreduce(self, send, recv, op):
        if send is not None:
            recv[...] = send
        self.dist.all_reduce(as_tensor(recv.reshape(-1)), self._op(op, recv.dtype),
                             group=self.pg)

    def reduce_scatter(self, send, recv, counts, op):
        flat = send.reshape(-1)
        me = self.rank
        at = int(sum(counts[:me]))
        if recv is not None and len(set(counts)) == 1:
            self._reduce_scatter(as_tensor(recv.reshape(-1)), as_tensor(flat),
                                 self._op(op, send.dtype), group=self.pg)
            return
        work = flat.copy() if recv is not None else flat     # in place: the buffer itself
        self.dist.all_reduce(as_tensor(work), self._op(op, send.dtype), group=self.pg)
        part = work[at:at + counts[me]]
        if recv is None:
            flat[:counts[me]] = part.copy() if at else part
        else:
            recv.reshape(-1)[...] = part

    def sendrecv(self, send, dest, recv, source):
        requests = [self.irecv(recv, source), self.isend(send, dest)]
        self.wait_all(requests)

    def reduces(self, dtype):
        return np.dtype(dtype).char in _REDUCES

    # ---------------------------------------------------- point to point

    def isend(self, buf, peer, sync=False):
        request = _Request(self.dist.P2POp(self.dist.isend, _bytes(buf), self._global(peer),
                                           self.pg))
        self._pending.append(request)
        return request

    def irecv(self, buf, peer):
        request = _Request(self.dist.P2POp(self.dist.irecv, _bytes(buf), self._global(peer),
                                           self.pg))
        self._pending.append(request)
        return request

    def _flush(self):
        """Start the operations posted since the last wait, as one batch (the
        messages of this rank to itself matched here, in posting order, and
        copied: gloo and NCCL take no peer that is the rank itself)."""
        pending, self._pending = self._pending, []
        me = self._global(self.rank)
        sends = [r for r in pending if r.op.peer == me and r.op.op is self.dist.isend]
        recvs = [r for r in pending if r.op.peer == me and r.op.op is not self.dist.isend]
        for send, recv in zip(sends, recvs):
            recv.op.tensor.copy_(send.op.tensor)
        if len(sends) != len(recvs):
            raise RuntimeError(f"{len(sends)} message(s) of rank {self.rank} to itself and "
                               f"{len(recvs)} receive(s) from itself in one batch")
        pending = [r for r in pending if r.op.peer != me]
        if not pending:
            return
        works = self.dist.batch_isend_irecv([r.op for r in pending])
        for request, work in zip(pending, works):
            request.work = work
            if self.backend != "nccl":          # gloo: done only once waited for
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(
                        POOL_THREADS, thread_name_prefix="mpiredist-wait")
                request.future = self._pool.submit(work.wait)

    def wait_some(self, requests):
        self._flush()
        local = [i for i, r in enumerate(requests) if r.work is None]
        if local:                               # messages to itself: done at the flush
            return local
        if self.backend == "nccl":
            while True:
                done = [i for i, r in enumerate(requests) if r.work.is_completed()]
                if done:
                    return done
                os.sched_yield()
        index = {id(r.future): i for i, r in enumerate(requests)}
        finished, _ = concurrent.futures.wait([r.future for r in requests],
                                              return_when=concurrent.futures.FIRST_COMPLETED)
        for f in finished:
            f.result()                          # the request's error, if any
        return sorted(index[id(f)] for f in finished)

    def wait_all(self, requests):
        self._flush()
        for r in requests:
            if r.future is not None:
                r.future.result()
            elif r.work is not None:            # None: a message to itself, done
                r.work.wait()

    # ------------------------------------------------------- structure

    def split(self, colour, key):
        chosen = self.allgather_object((colour, key))
        mine = sorted((k, r) for r, (c, k) in enumerate(chosen) if c == colour)
        members = tuple(self._global(r) for _, r in mine)
        return self._group(members)

    def dup(self):
        return self._group(tuple(self.ranks), fresh=True)

    def _group(self, members, fresh=False):
        found = None if fresh else self.known.get(members)
        if found is not None:
            return TorchGroup(found, known=self.known)
        pg = self.dist.new_group(ranks=list(members), use_local_synchronization=True)
        return TorchGroup(pg, owned=True, known=self.known)

    def free(self):
        super().free()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        if self.owned and self.pg is not None and self.dist.is_initialized():
            try:
                self.dist.destroy_process_group(self.pg)
            except (RuntimeError, ValueError):      # already gone with the default one
                pass
        self.pg = None

    # -------------------------------------------- agreement and failure

    def bitwise_or(self, words):
        signed = words.view(np.int64)
        if self.backend == "nccl":                  # NCCL has no bitwise reductions
            found = np.bitwise_or.reduce(np.array(self.allgather_object(signed.copy())))
            signed[...] = found
            return
        self.dist.all_reduce(as_tensor(signed), self.dist.ReduceOp.BOR, group=self.pg)

    def allgather_object(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.pg)
        return out

    def nodes(self):
        hosts = self.allgather_object(socket.gethostname())
        return [hosts.index(h) for h in hosts]

    def abort(self, code=1):
        # the process ends: torchrun's agent sees a worker exit with an error and
        # stops the others; peers inside a gloo collective fail with "connection
        # closed by peer" at once instead of waiting for the group's timeout
        os._exit(code)


_WORLD = []             # [the default process group, its TorchGroup]


def world():
    """The :class:`TorchGroup` of torch.distributed's default group (made when
    the default group is new; torch.distributed must be initialised)."""
    _, dist = _torch()
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call "
                           "torch.distributed.init_process_group first (torchrun sets "
                           "what it needs)")
    pg = dist.group.WORLD
    if not _WORLD or _WORLD[0] is not pg:
        _WORLD[:] = [pg, TorchGroup(None)]
    return _WORLD[1]
