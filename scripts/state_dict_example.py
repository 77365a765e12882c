"""A worked example: a transformer-like state dict resharded, then synced, in one move each.

    mpiexec -n 8 python scripts/state_dict_example.py [--layers 24] [--hidden 256]

1. Reshard on the mesh ``dp=2,tp=4`` (any even rank count: ``dp=2,tp=P/2``)
   from tensor-parallel layouts (column-parallel weights sharded on their
   output dim, row-parallel ones on their input dim, vectors of
   column-parallel layers sharded, the rest replicated) to fully sharded
   (FSDP: every tensor's first dim over ``dp`` and ``tp``), with one
   :class:`mpiredist.TransferGroup`.
2. Sync the tensor-parallel state dict from the first half of the ranks (4
   training ranks) to the other half (4 inference ranks) where every weight
   is sharded on its columns and vectors replicated, with
   :func:`mpiredist.redistribute_many` (ranks outside the training mesh pass
   None).

Every block is checked against numpy slicing of the full arrays (built
from one seed on every rank); the sizes (314 tensors at 24 layers, hidden
256: 56 MiB) are scaled to a laptop.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()

    from mpi4py import MPI

    import mpiredist as mr
    from benchmarks.bench_state_dict import layout_cases, state_dict
    from mpiredist.planning.pieces import layout_boxes

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    sd = state_dict(args.layers, args.hidden)
    rng = np.random.default_rng(0)
    full = {n: rng.standard_normal(s).astype(np.float32) for n, (s, _) in sd.items()}

    def block(name, shape, mesh, layout):
        box = layout_boxes(shape, mesh, mr.Layout.parse(layout), p)[rank]
        return None if box is None else np.ascontiguousarray(
            full[name][tuple(slice(a, b) for a, b in box)])

    failures = 0
    for case, spec in layout_cases(sd, p).items():
        mesh = mr.Mesh(spec["mesh"], ranks=spec["ranks"])
        dst_mesh = mesh if spec["dst_mesh"] is None else mr.Mesh(spec["dst_mesh"],
                                                                 ranks=spec["dst_ranks"])
        items = spec["items"]
        blocks = {n: block(n, s, mesh, src) for n, (s, src, _) in items.items()}
        if case == "reshard":
            group = mr.TransferGroup({n: (s, "float32", src, dst)
                                      for n, (s, src, dst) in items.items()}, mesh)
            out = group.run(blocks)
            how = group.explain().splitlines()[0]
            group.free()
        else:
            out = mr.redistribute_many(
                None if mesh.ranks is not None and rank not in mesh.ranks else blocks,
                {n: s for n, (s, _, _) in items.items()}, mesh,
                {n: src for n, (_, src, _) in items.items()},
                {n: dst for n, (_, _, dst) in items.items()}, dst_mesh=dst_mesh)
            how = "redistribute_many"
        wrong = [n for n, (s, _, dst) in items.items()
                 if not ((out[n] is None and block(n, s, dst_mesh, dst) is None) or
                         np.array_equal(out[n], block(n, s, dst_mesh, dst)))]
        wrong = comm.allreduce(len(wrong))
        failures += wrong
        if rank == 0:
            mib = sum(a.nbytes for a in full.values()) / 2**20
            print(f"{case}: {len(items)} tensors, {mib:.1f} MiB, {spec['mesh']} -> "
                  f"{spec['dst_mesh'] or spec['mesh']}: "
                  f"{'ok' if not wrong else f'{wrong} WRONG blocks'} ({how})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
