"""The peers' own redistributions against mpiredist's drop-ins, side by side in one run.

    mpiexec -n 8 python -m benchmarks.bench_peers [--scale 4] [--repeats 5] [--cases c01,c02]
        [--json FILE]
    torchrun --nproc-per-node 8 -m benchmarks.bench_peers [...]      # no MPI: gloo only

Under ``mpiexec`` mpiredist moves over MPI and DTensor over gloo; under
``torchrun`` both move over the same gloo process groups in the same
processes, so that what differs is the plan (and HeAT, which needs MPI,
is left out).

``dtensor``: the shared cases as DTensor placements (``Layout.to_placements``
on a ``DeviceMesh`` of the case's mesh; cases DTensor cannot say, such as
a dim sharded against mesh-dim order, are listed as
skipped), a DTensor made by ``distribute_tensor``, then
``x.redistribute(mesh, dst)`` (DTensor, gloo) against
``mr.torch.redistribute(x, dst)``; a partial source holds the block of the
array on every device of its Partial mesh dims.  ``heat``: a 2-D float32 array of the
case's size resplit between split axes (0 -> 1, 1 -> 0, 0 -> None, None ->
1) with ``heat.resplit`` against ``mr.heat.resplit``.  Each side: the
median time over ``--repeats`` of the slowest rank (after a warm-up), the
growth of the peak resident set in one more run (max over ranks; torch
allocates outside tracemalloc) and that figure over max(S, T) + W, the
memory contract of mpiredist (S, T this rank's blocks, W the default
workspace); ``x`` is the peer's time over mpiredist's.  Every result is
checked against the peer's.  HeAT's cases run before torch.distributed is
initialised (with gloo over 127.0.0.1, for DTensor's cases): gloo's idle
threads would take CPU from every case after them; HeAT needs ``tests/stubs`` on PYTHONPATH on a CPU
torch (its torchvision import).
"""

import argparse
import json
import os
import socket
import sys

import numpy as np

__all__ = ["main"]


def _init_gloo(group):
    """torch.distributed's default group over the job's ranks (gloo)."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    port = None
    if group.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = group.allgather_object(port)[0]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=group.rank, world_size=group.size)


def _measure(group, fn, repeats):
    from mpiredist.bench.measure import rss_peak, rss_supported
    from mpiredist.runtime.timing import slowest_median
    result = fn()
    seconds = slowest_median(group, fn, repeats)
    rss = None
    if rss_supported():
        group.allgather_object(None)
        with rss_peak() as r:
            out = fn()
        del out
        rss = max(group.allgather_object(r.bytes))
    return result, seconds, rss


def _bound(group, s_bytes, t_bytes):
    from mpiredist.planning.budget import workspace_for
    most = max(group.allgather_object(max(s_bytes, t_bytes)))
    return max(group.allgather_object(max(s_bytes, t_bytes) + workspace_for(most)))


def _row(case, peer, their, ours, bound, ok):
    (tt, tr), (ot, orss) = their, ours
    return dict(case=case, peer=peer, peer_ms=tt * 1e3, ours_ms=ot * 1e3, x=tt / ot,
                peer_rss=tr, ours_rss=orss, bound=bound, ok=ok)


def _dtensor_rows(group, args):
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    import mpiredist as mr
    from mpiredist.bench.cases import load_cases, scaled
    _init_gloo(group)
    rows, skipped = [], []
    p = group.size
    wanted = set(filter(None, args.cases.split(",")))
    for case in load_cases():
        if wanted and case.id not in wanted and case.short_id not in wanted:
            continue
        sizes = list(case.mesh.values())
        if int(np.prod(sizes)) != p:
            skipped.append((case.short_id, f"mesh of {int(np.prod(sizes))} ranks"))
            continue
        names = list(case.mesh)
        try:
            src, dst = case.src.to_placements(names), case.dst.to_placements(names)
        except mr.LayoutError as exc:
            skipped.append((case.short_id, str(exc)[:70]))
            continue
        c = scaled(case, args.scale)
        mesh = DeviceMesh("cpu", torch.arange(p).reshape(sizes), mesh_dim_names=tuple(names))
        torch.manual_seed(0)
        G = torch.randn(c.shape)
        # a partial source: every device of a Partial mesh dim holds its block of G
        whole = [Replicate() if isinstance(q, Partial) else q for q in src]
        x = DTensor.from_local(distribute_tensor(G, mesh, whole).to_local(), mesh, src,
                               run_check=False, shape=G.shape, stride=G.stride())
        theirs, tt, tr = _measure(group, lambda: x.redistribute(mesh, dst), args.repeats)
        ours, ot, orss = _measure(group, lambda: mr.torch.redistribute(x, dst), args.repeats)
        ok = torch.equal(theirs.to_local(), ours.to_local()) if tuple(
            theirs.to_local().shape) == tuple(ours.to_local().shape) else False
        ok = all(group.allgather_object(bool(ok)))
        bound = _bound(group, x.to_local().numel() * 4, ours.to_local().numel() * 4)
        rows.append(_row(case.short_id, "dtensor", (tt, tr), (ot, orss), bound, ok))
    return rows, skipped


def _heat_rows(group, args):
    import heat as ht

    import mpiredist as mr
    rows = []
    n = max(8, 4096 // args.scale)
    shape = (n + 1, n - 1)                  # uneven on both dims
    base = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
    for split, axis in ((0, 1), (1, 0), (0, None), (None, 1)):
        x = ht.array(base, split=split)
        theirs, tt, tr = _measure(group, lambda: ht.resplit(x, axis), args.repeats)
        ours, ot, orss = _measure(group, lambda: mr.heat.resplit(x, axis), args.repeats)
        ok = all(group.allgather_object(bool((theirs.larray == ours.larray).all())))
        bound = _bound(group, x.larray.numel() * 4, ours.larray.numel() * 4)
        rows.append(_row(f"{shape[0]}x{shape[1]} {split}->{axis}", "heat", (tt, tr), (ot, orss),
                         bound, ok))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="")
    parser.add_argument("--peers", default="dtensor,heat")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from mpiredist.runtime.groups import world_group
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if torchrun:
        import torch.distributed as dist
        dist.init_process_group("gloo")
    group = world_group()
    rows, skipped, missing = [], [], []
    peers = args.peers.split(",")
    if torchrun and "heat" in peers:
        peers.remove("heat")
        missing.append("heat (it runs over MPI: launch with mpiexec)")
    # HeAT's cases run first: once torch.distributed is up, gloo's groups (one
    # per DeviceMesh dim) leave about 66 threads a process that take CPU while
    # idle (about 25 ms a second each, 8 ranks: a tenth of this machine's two
    # cores), which slowed both sides of every later case; mpiredist's
    # exchanges, p2p under heavy yield, more than HeAT's (5.6 -> 9.7 ms)
    heat_rows = []
    if "heat" in peers:
        try:
            import heat  # noqa: F401
            heat_rows = _heat_rows(group, args)
        except ImportError as exc:
            missing.append(f"heat ({exc})")
    if "dtensor" in peers:
        try:
            import torch  # noqa: F401
            found, skipped = _dtensor_rows(group, args)
            rows += found
        except ImportError as exc:
            missing.append(f"dtensor ({exc})")
    rows += heat_rows
    if group.rank == 0:
        mib = (lambda b: "-" if b is None else f"{b / 2**20:.2f}")
        print(f"peers: {group.size} ranks, scale {args.scale}, median of {args.repeats}; "
              f"mpiredist over {group.library}, DTensor over gloo")
        print(f"{'case':18} {'peer':8} {'peer ms':>9} {'ours ms':>9} {'x':>6} {'peer RSS':>9} "
              f"{'ours RSS':>9} {'bound':>7} {'peer/b':>7} {'ours/b':>7} check")
        for r in rows:
            pb = "-" if r["peer_rss"] is None else f"{r['peer_rss'] / r['bound']:.2f}"
            ob = "-" if r["ours_rss"] is None else f"{r['ours_rss'] / r['bound']:.2f}"
            print(f"{r['case']:18} {r['peer']:8} {r['peer_ms']:>9.2f} {r['ours_ms']:>9.2f} "
                  f"{r['x']:>6.2f} {mib(r['peer_rss']):>9} {mib(r['ours_rss']):>9} "
                  f"{mib(r['bound']):>7} {pb:>7} {ob:>7} {'ok' if r['ok'] else 'DIFFERS'}")
        for case, why in skipped:
            print(f"skipped {case}: {why}")
        for m in missing:
            print(f"not installed: {m}")
        faster = [r for r in rows if r["x"] > 1]
        within = [r for r in rows if r["ours_rss"] is not None
                  and r["ours_rss"] <= r["bound"] + (1 << 20)]
        print(f"mpiredist faster on {len(faster)} of {len(rows)} (target: every case); "
              f"within max(S, T) + W + 1 MiB (RSS) on {len(within)} of {len(rows)}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(rows=rows, skipped=skipped), f, indent=1)
    bad = sum(not r["ok"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
