"""Runtime: running plans over MPI.

Communicators, agreement across ranks, :class:`~mpiredist.runtime.transfer.Transfer`
(plan once, run many) and the executors it drives: out of place, one buffer,
and the packed point-to-point moves they share.
"""
