"""Research harnesses of mpiredist, beside the package (as numpy keeps its benchmarks).

The main job, ``python -m mpiredist.bench``, is in the package; these are
the studies behind its figures and the project's notes, each run from the
repository root under MPI, e.g.::

    mpiexec -n 8 python -m benchmarks.bench_overhead
    mpiexec -n 5 python -m benchmarks.soak --cases 300 --seed 1

=================== ======================================================
module              what it measures
=================== ======================================================
``bench_peers``     DTensor and HeAT against the drop-ins, side by side
``bench_state_dict`` many arrays: a state dict moved by a group, loops, a
                    bucketed broadcast, floors
``bench_cross_mesh`` between meshes and rank groups
``bench_floors``    what the copies alone cost on this machine
``bench_overhead``  per-call cost on small blocks
``bench_analytics`` reshape, a.T @ a, a + b, slicing
``bench_planning``  planning speed and the first call's memory (no MPI)
``soak``            random redistributions against an oracle
=================== ======================================================

They import the package and its bench (:mod:`mpiredist.bench`) by their
public names.
"""
