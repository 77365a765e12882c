"""Measure this machine's figures for the planner's profile (collective; run under MPI).

    mpiexec -n 8 python -m mpiredist calibrate [--json FILE] [--bytes N] [--quick]

The figures are those of the transport in use (MPI's ``COMM_WORLD`` by
default, or any group, :mod:`mpiredist.runtime.transport`): every
measurement goes through its operations, as the runs it will price do.

Writes the JSON profile of :mod:`mpiredist.planning.profile` (default
``$XDG_CONFIG_HOME/mpiredist/profile.json``; ``MPIREDIST_PROFILE`` makes the
planner read another file).  Every figure is the median over ``--repeats``
of the slowest rank's time, so all ranks compute the same profile:

``alpha``
    seconds per message: a ring ``sendrecv`` of 8 bytes, 20 in a row.
``beta[op][G]``
    bytes per second per rank of each collective kind on groups of G
    consecutive ranks (every divisor G >= 2 of the rank count that is a
    power of two, and the whole), each rank sending ``--bytes`` by the
    plans' byte conventions (docs/semantics.md): non-blocking sends and
    receives to every other member, then one wait, for all_to_all and
    exchange alike (the runtime moves both so above the one-call size, so
    one measurement serves both: measured apart, noise alone would pick
    between plans of equal bytes),
    ``allgather``, ``reduce_scatter`` of equal parts, ``allreduce`` and a
    ring ``sendrecv`` (permute); the latency of the model's rounds is taken
    off.
``beta_across[op][G]``
    on two or more nodes (:func:`mpiredist.runtime.groups.topology`, every
    node with as many ranks): ``beta`` is measured on groups inside nodes
    (G dividing the ranks per node, every node's groups at once), and
    ``beta_across`` on groups of G ranks on G different nodes (the j-th rank
    of each, every j at once, so the ranks of a node share its link as a
    plan's steps do): bytes per second per rank of bytes that cross nodes;
    and on the whole communicator node by node (G = P), where the MPI
    library's own algorithm may cross nodes less than sending to every
    member directly would (``_whole``).
    The planner prices a step's across-node bytes at these
    (:mod:`mpiredist.planning.nodes`).  Nodes of different sizes: one level.
``pack_rate``
    bytes per second of copying half the columns of a block into a
    contiguous buffer (what packing a strided piece costs).
``datatype_rate``
    bytes per second of the same piece sent as a box of its array (an MPI
    subarray datatype, to the next rank), against the contiguous send; the
    packing rate where the transport takes no boxes.
``memory_bandwidth``
    bytes per second of a contiguous copy.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from .failure import abort_on_exception
from .groups import as_group
from .groups import topology as find_topology
from .timing import slowest_median
from .transport import Strided

__all__ = ["main", "measure", "calibrate_run", "calibrate_arguments"]

ROUNDS = {"all_to_all": lambda g: g - 1, "exchange": lambda g: g - 1,
          "all_gather": lambda g: g - 1, "reduce_scatter": lambda g: g - 1,
          "all_reduce": lambda g: 2 * (g - 1), "permute": lambda g: 1}


def _timed(group, fn, repeats):
    """Median over ``repeats`` of the slowest rank's seconds, after a warm-up."""
    return slowest_median(group, fn, repeats, warmup=True)


def _latency(group, repeats):
    g, me = group.size, group.rank
    if g == 1:
        return 0.0
    send, recv = np.zeros(8, np.uint8), np.empty(8, np.uint8)

    def ring():
        for _ in range(20):
            group.sendrecv(send, (me + 1) % g, recv, (me - 1) % g)
    return _timed(group, ring, repeats) / 20


def _collective(op, group, nbytes):
    """A callable running ``op`` on ``group`` so that each rank sends about ``nbytes``."""
    g, me = group.size, group.rank
    c = max(1, nbytes // (g - 1))
    if op in ("all_to_all", "exchange"):
        send, recv = np.ones(g * c, np.uint8), np.empty(g * c, np.uint8)
        peers = [(me + k) % g for k in range(1, g)]

        def exchange():             # as the runtime moves both: isend/irecv, then wait
            reqs = [group.irecv(recv[p * c:(p + 1) * c], p) for p in peers]
            reqs += [group.isend(send[p * c:(p + 1) * c], p) for p in peers]
            group.wait_all(reqs)
        return exchange
    if op == "all_gather":
        send, recv = np.ones(c, np.uint8), np.empty(g * c, np.uint8)
        return lambda: group.allgather(send, recv, [c] * g)
    if op == "reduce_scatter":
        m = max(1, c // 4)
        send, recv = np.ones(g * m, np.float32), np.empty(m, np.float32)
        return lambda: group.reduce_scatter(send, recv, [m] * g, "sum")
    if op == "all_reduce":
        n = max(1, nbytes * g // (8 * (g - 1)))
        send, recv = np.ones(n, np.float32), np.empty(n, np.float32)
        return lambda: group.allreduce(send, recv, "sum")
    send, recv = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    return lambda: group.sendrecv(send, (me + 1) % g, recv, (me - 1) % g)


def _groups(size):
    """Group sizes measured: powers of two dividing ``size``, and ``size``."""
    out, g = set(), 2
    while g <= size:
        if size % g == 0:
            out.add(g)
        g *= 2
    if size >= 2:
        out.add(size)
    return sorted(out)


def _rate(nbytes, seconds, latency=0.0):
    return nbytes / max(seconds - latency, seconds * 0.1, 1e-9)


def _local_rates(group, nbytes, repeats):
    """``(pack_rate, datatype_rate, memory_bandwidth)``."""
    cols = 1024
    rows = max(2, nbytes // (4 * cols))
    block = np.ones((rows, cols), np.float32)
    half = block[:, : cols // 2]
    packed = np.empty(half.shape, np.float32)
    pack = _rate(half.nbytes, _timed(group, lambda: np.copyto(packed, half), repeats))
    flat = block.reshape(-1)
    copy = np.empty_like(flat)
    memory = _rate(flat.nbytes, _timed(group, lambda: np.copyto(copy, flat), repeats))
    g, me = group.size, group.rank
    if g == 1 or not group.strided:
        return pack, pack, memory
    box = Strided(block, (0, 0), (rows, cols // 2))

    def typed():
        group.sendrecv(box, (me + 1) % g, packed, (me - 1) % g)

    def plain():
        group.sendrecv(packed, (me + 1) % g, copy[:packed.size], (me - 1) % g)
    t_typed, t_plain = _timed(group, typed, repeats), _timed(group, plain, repeats)
    extra = max(t_typed - t_plain, t_typed * 0.05)      # what the datatype adds
    return pack, _rate(half.nbytes, extra), memory


def measure(comm, nbytes=4 << 20, repeats=5, topology=None):
    """The profile dictionary (collective; identical on every rank).

    ``topology``: the node of each rank (default the communicator's own,
    :func:`mpiredist.runtime.groups.topology`); on two or more nodes of equal
    size the rates are measured by link class (module docstring).  ``comm``:
    a group or an mpi4py communicator.
    """
    from ..planning.profile import VERSION

    comm = as_group(comm)
    size, rank = comm.size, comm.rank
    nodes = find_topology(comm) if topology is None else topology
    alpha = _latency(comm, repeats)
    doc = {"version": VERSION, "alpha": alpha}
    if nodes.count > 1 and nodes.per_node is not None:
        node = nodes.node(rank)
        j = [r for r in range(size) if nodes.node(r) == node].index(rank)   # place on node
        doc["beta"] = _rates(comm, nbytes, repeats, alpha, _groups(nodes.per_node),
                             lambda g: (node, j // g), j)
        doc["beta_across"] = _rates(comm, nbytes, repeats, alpha, _groups(nodes.count),
                                    lambda g: (j, node // g), node)
        if nodes.per_node > 1:
            _whole(comm, nbytes, repeats, alpha, nodes, node * nodes.per_node + j, doc)
        doc.update(nodes=nodes.count, ranks_per_node=nodes.per_node)
    else:
        doc["beta"] = _rates(comm, nbytes, repeats, alpha, _groups(size),
                             lambda g: (rank // g,), rank)
    pack, datatype, memory = _local_rates(comm, nbytes, repeats)
    doc.update(pack_rate=pack, datatype_rate=datatype, memory_bandwidth=memory, ranks=size,
               bytes=nbytes, repeats=repeats, host=platform.node(),
               mpi=comm.library,
               date=time.strftime("%Y-%m-%dT%H:%M:%S"))
    return doc


def _whole(comm, nbytes, repeats, alpha, nodes, key, doc):
    """``beta_across[op][P]``: every rank in one group, node by node, priced as
    the planner prices it: of what a rank sends by the byte conventions, the
    share to other nodes ((C-1) R of its G-1 peers) goes at this rate, the
    rest at the within-node one.  What the MPI library's own algorithm saves
    across nodes (a ring forwards blocks inside nodes) shows as a higher
    rate.  Permutes are left out: a ring shift crosses at two ranks only."""
    from ..planning.profile import OPS

    size, per = comm.size, nodes.per_node
    share = (nodes.count - 1) * per / (size - 1)
    sub = comm.split(0, key)
    try:
        for op in OPS:
            if op == "permute":
                continue
            if op == "exchange":
                doc["beta_across"][op][str(size)] = doc["beta_across"]["all_to_all"][str(size)]
                continue
            t = _timed(comm, _collective(op, sub, nbytes), repeats) - ROUNDS[op](size) * alpha
            inside = doc["beta"][op]
            within = inside[max((g for g in inside if int(g) <= per), key=int)] \
                if inside else None
            left = t - (0.0 if within is None else nbytes * (1 - share) / within)
            doc["beta_across"][op][str(size)] = nbytes * share / max(left, t * 0.1, 1e-9)
    finally:
        sub.free()


def _rates(comm, nbytes, repeats, alpha, groups, color, key):
    """``{op: {G: bytes/s}}`` on the groups of each size G in ``groups``:
    ranks with the same ``color(G)`` form one (ordered by ``key``), all
    groups at once."""
    from ..planning.profile import OPS

    beta = {op: {} for op in OPS}
    for g in groups:
        a, b = (color(g) + (0,))[:2]
        sub = comm.split(a * comm.size + b, key)
        try:
            for op in OPS:
                if op == "exchange":            # measured once with all_to_all (above)
                    beta[op][str(g)] = beta["all_to_all"][str(g)]
                    continue
                t = _timed(comm, _collective(op, sub, nbytes), repeats)
                beta[op][str(g)] = _rate(nbytes, t, ROUNDS[op](g) * alpha)
        finally:
            sub.free()
    return beta


def _parser():
    from ..planning.profile import default_path

    p = argparse.ArgumentParser(prog="python -m mpiredist calibrate",
                                description=__doc__.split("\n\n")[0])
    calibrate_arguments(p, default_path())
    return p


def calibrate_arguments(p, default):
    p.add_argument("--json", metavar="FILE", default=None,
                   help=f"where to write the profile (default {default})")
    p.add_argument("--bytes", type=int, default=4 << 20,
                   help="bytes each rank sends per measured collective (default 4 MiB)")
    p.add_argument("--repeats", type=int, default=5, help="medians over this many (default 5)")
    p.add_argument("--quick", action="store_true",
                   help="64 KiB and 3 repeats: a check that the command works")


def calibrate_run(args, comm=None):
    """Measure and write the profile; print its figures on rank 0.  Exit status.

    An uncaught exception on any rank aborts the job.
    """
    return abort_on_exception(_calibrate, args, comm)


def _calibrate(args, comm):
    from ..planning.profile import Profile, default_path

    comm = as_group(comm)
    nbytes, repeats = (64 << 10, 3) if args.quick else (args.bytes, args.repeats)
    doc = measure(comm, nbytes, repeats)
    Profile.from_dict(doc, "the measured one")          # checks it is complete
    path = Path(args.json) if args.json else default_path()
    if comm.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        print(f"profile of {doc['ranks']} ranks ({doc['mpi']}) written to {path}")
        print(f"  alpha {doc['alpha'] * 1e6:.2f} us; pack {doc['pack_rate'] / 1e9:.2f} GB/s, "
              f"datatype {doc['datatype_rate'] / 1e9:.2f} GB/s, "
              f"copy {doc['memory_bandwidth'] / 1e9:.2f} GB/s")
        if "beta_across" in doc:
            print(f"  {doc['nodes']} nodes x {doc['ranks_per_node']} ranks: within nodes, "
                  "then across them")
        for key in ("beta", "beta_across"):
            for op, sizes in doc.get(key, {}).items():
                text = ", ".join(f"G={g}: {b / 1e9:.2f}" for g, b in sizes.items())
                print(f"  {op:15s} GB/s per rank  {text}" + ("  (across nodes)"
                      if key == "beta_across" else ""))
    comm.allgather_object(None)         # nobody returns before the file is written
    return 0


def main(argv=None, comm=None):
    return calibrate_run(_parser().parse_args(argv), comm)


if __name__ == "__main__":
    sys.exit(abort_on_exception(main))   # a failure on any rank ends the job
