"""Probe: the named mpiredist functions a warm DistArray.redistribute enters
before its first MPI call that moves data.

    mpiexec -n 2 python tests/callpath.py [-v]

The call is a transpose, ``[{x}, {}] -> [{}, {x}]`` on ``x=P``, after three
warm-up calls.  ``sys.settrace``: every Python call into a file of the
mpiredist package whose name does not start with ``<`` counts once (distinct
module and qualified name); a line of the package that calls a data-moving
mpi4py method (not the agreement's reduction, ``agree``/``bitwise_or``/
``allgather_object``/``nodes``) arms the stop, which happens at the next
event of that frame, so the functions called to build the call's arguments
count too.  Rank 0 prints one JSON line: the count, the modules, the call.
"""
import json
import linecache
import os
import re
import sys

import numpy as np
from mpi4py import MPI

import mpiredist as mr

CALL = re.compile(r"\.(Alltoall|Alltoallv|Alltoallw|Allgather|Allgatherv|Sendrecv|Isend|Irecv|"
                  r"Issend|Send|Recv|Reduce_scatter|Reduce_scatter_block|Allreduce|Bcast|"
                  r"Isendrecv|Neighbor_alltoallv)\(")
root = os.path.dirname(mr.__file__)
P = MPI.COMM_WORLD.Get_size()
mesh = mr.Mesh({"x": P})
g = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
a = mr.DistArray.from_global(g, mesh, "[{x}, {}]")
for _ in range(3):
    b = a.redistribute("[{}, {x}]")
seen, order = set(), []
state = {"armed": None, "stop": False}


def tracer(frame, event, arg):
    if state["stop"]:
        return None
    co = frame.f_code
    mine = co.co_filename.startswith(root)
    if state["armed"] is frame and event in ("line", "return"):
        state["stop"] = True
        order.append(("MPI", state["text"]))
        return None
    if event == "call":
        if mine and not co.co_name.startswith("<"):
            key = (os.path.relpath(co.co_filename, root), co.co_qualname)
            if key not in seen:
                seen.add(key)
                order.append(key)
        return tracer if mine else None
    if event == "line" and mine and state["armed"] is None:
        text = linecache.getline(co.co_filename, frame.f_lineno)
        if CALL.search(text) and "agree" not in co.co_filename and co.co_name not in (
                "bitwise_or", "allgather_object", "nodes"):   # the agreement's reductions
            state["armed"], state["text"] = frame, text.strip()
    return tracer


sys.settrace(tracer)
b = a.redistribute("[{}, {x}]")
sys.settrace(None)
assert np.array_equal(b.gather(), g)
if MPI.COMM_WORLD.Get_rank() == 0:
    mods = sorted({m for m, _ in order if m != "MPI"})
    if "-v" in sys.argv:
        for i, k in enumerate(order):
            print(i + 1, *k)
    print(json.dumps({"functions": len(order) - 1, "modules": mods, "call": order[-1][1],
                      "path": [f"{m}:{f}" for m, f in order[:-1]]}))
