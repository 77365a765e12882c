"""Runtime: running plans over MPI.

Communicators (``comm``), the one agreement across ranks (``agree``), the
checks of a rank's inputs (``inputs``), :class:`~mpiredist.runtime.transfer.Transfer`
(plan once, run many: ``transfer``), the steps of a plan written once over
a memory strategy (``steps``, ``memory``, with the one-buffer kernels in
``onebuffer``), the one exchange engine (``exchange``) over the
point-to-point pipeline (``p2p``), count-safe collectives (``collectives``)
and what a Transfer keeps between runs (``context``).
"""
