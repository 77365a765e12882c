"""Runtime: running plans over a transport.

The transport seam (``transport``: the operations the runtime needs from a
group of ranks) with MPI (``mpi``, the only module that imports mpi4py) and
threads (``threads``, for tests) behind it; the groups of a mesh and what
is kept per group (``groups``); the one agreement (``agree``); the checks
of a rank's inputs (``inputs``) and of its memory (``resources``); the one
run path every redistribution takes (``run``); making a Transfer
(``compile``) and its two kinds, a plan on one mesh (``onemesh``) and an
exchange between meshes or boxes (``between``), with ``explain``; many
arrays at once (``group``); the steps of a plan, each kind once (``steps``),
over a memory strategy (``memory``, ``onebuffer`` with the in-place kernels
of ``kernels``); reductions within a budget (``reductions``); the one
exchange engine (``exchange``) over the point-to-point pipeline (``p2p``);
what a compiled run keeps (``context``); device arrays (``devices``); what a
failure after data moved does (``failure``).
"""
