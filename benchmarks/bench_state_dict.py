"""Many arrays: a transformer-like state dict resharded and synced, group against loops.

    mpiexec -n 8 python -m benchmarks.bench_state_dict [--layers 24] [--hidden 256]
        [--repeats 5] [--out] [--warm] [--workspace MIB] [--json FILE]

The state dict (:func:`state_dict`): embeddings, per layer the attention
projections q, k, v, o with their biases, the MLP's up projection with its
bias and its down projection, two norms, and a final norm: ``13 L + 2``
tensors (314 at 24 layers), float32.  Two cases:

``reshard``  on the mesh ``dp=2,tp=P/2``: from tensor-parallel layouts
             (column-parallel weights ``[{tp}, {}]``, row-parallel
             ``[{}, {tp}]``, vectors of column-parallel layers on ``tp``,
             the rest replicated) to fully sharded (``[{dp,tp}, ...]`` on the
             first dim: FSDP);
``sync``     from the tensor-parallel layouts on the first half of the ranks
             (``t=P/2``, training) to the second half (``s=P/2``, inference),
             every 2-D weight sharded on its columns there, vectors
             replicated.

Strategies, each made and warmed up (and checked) first, then timed side
by side: each of ``--repeats`` repeats runs every strategy once, in an
order drawn anew each repeat (alike on every rank), and a strategy's
figure is the median over repeats of the slowest rank
(:func:`~mpiredist.runtime.timing.slowest_medians`), so that a slow spell of
the machine, or what the run before leaves behind, falls on all of them
alike.  Before every timed run the heap's free memory goes back to the
system (glibc ``malloc_trim``), so that every strategy starts alike and
its new arrays are faulted in (about 3 us a page on this project's
machine); with ``--warm`` the heap stays as the runs before left it, and
strategies of many small arrays (the group's targets, the loops') reuse
the free memory that the others leave.  Every run returns new target
blocks, or with ``--out`` fills the
blocks of the warm-up (``run(out=)``: weight sync into parameters that
exist; checked again after the timing; ``bcast`` is left out):

``group``      one :class:`~mpiredist.TransferGroup` made once, ``g.run(blocks)``
               (its default W, or ``--workspace`` MiB: a larger W makes
               fewer buckets, each one ``Alltoallv``, and raises the bound);
``group-gloo`` the same TransferGroup on the same ranks over torch.distributed
               (gloo, set up over the MPI ranks; the meshes' ``comm`` the
               default group's :class:`~mpiredist.runtime.torchdist.TorchGroup`):
               what a torchrun job gets, side by side with MPI (not in the
               default strategies: it needs torch);
``loop``       one checked :class:`~mpiredist.Transfer` per tensor, made once,
               each ``t.run(block)`` in turn (what a per-parameter loop does);
``unchecked``  the same with ``checked=False`` (no agreement per run);
``bcast``      what RL weight-sync code does: each tensor gathered whole on
               the source group (mpiredist all-gather to ``[{}, ...]``), the
               whole tensors packed into buckets of ``--bucket`` MiB on the
               first source rank, each bucket ``Bcast`` to every rank, and
               every target rank copying its block out;
``floor``      one Transfer of a single float32 array of the same bytes in
               the layout pair of the column-parallel weights (the block rows
               of every tensor stacked: ``[{tp}, {}]`` to the target layout
               of the first dim): the issue's floor, what coalescing into
               one such array would reach;
``patterns``   the floor by pattern: one Transfer per layout pair of the
               state dict (``(src, dst)`` and 2-D or not), each of a single
               array of those tensors' bytes (``(elements / hidden, hidden)``
               or flat), run in turn, unchecked (a coalesced move agrees
               once): the same bytes moved the same ways as whole arrays.  Where the state dict holds tensors that move
               otherwise than the floor's array (the row-parallel weights of
               ``reshard`` make an all-to-all that places columns), this is
               the floor of its data movement; no target is set on it.

Columns: milliseconds, ``x group`` (the strategy's time over the
group's), MPI calls that move data per run on the slowest rank (group:
``TransferGroup.calls``; Transfers: their StepRecords; bcast: its calls),
peak MiB per rank (tracemalloc of one untimed run, max over ranks; the
result included, and what the group keeps between runs, its bucket buffer:
``TransferGroup.kept_bytes``), the growth of the peak resident set in one
more run (``RSS MiB``, MPI's buffers included, plus the kept buffer;
meaningful with the allocator settings of
``mpiredist.bench.measure.RSS_ENVIRONMENT``) and the group's bound
sum max(S_i, T_i) + W.  With ``--out`` the filled blocks are not new and
are not counted, nor what a Transfer keeps between runs that are given
``out=`` (its pooled buffers); the group's kept buffer is.  The targets
of the many-arrays issue are printed with the figures.
"""

import argparse
import json
import math
import sys

import numpy as np

__all__ = ["state_dict", "main"]


def state_dict(layers, hidden, vocab=None, ffn=None):
    """``{name: (shape, kind)}``: kind ``col`` (column-parallel, output dim
    first), ``row`` (row-parallel), ``vec_col`` (a vector of a column-parallel
    layer), ``vec`` (replicated) or ``emb``."""
    vocab, ffn = vocab or 16 * hidden, ffn or 4 * hidden
    out = {"embed.weight": ((vocab, hidden), "emb")}
    for i in range(layers):
        p = f"layers.{i}."
        for n in ("q", "k", "v"):
            out[p + f"attn.{n}.weight"] = ((hidden, hidden), "col")
            out[p + f"attn.{n}.bias"] = ((hidden,), "vec_col")
        out[p + "attn.o.weight"] = ((hidden, hidden), "row")
        out[p + "attn.o.bias"] = ((hidden,), "vec")
        out[p + "mlp.up.weight"] = ((ffn, hidden), "col")
        out[p + "mlp.up.bias"] = ((ffn,), "vec_col")
        out[p + "mlp.down.weight"] = ((hidden, ffn), "row")
        out[p + "norm1.weight"] = ((hidden,), "vec")
        out[p + "norm2.weight"] = ((hidden,), "vec")
    out["norm.weight"] = ((hidden,), "vec")
    return out


def _tp_layout(kind, ndim, tp):
    return {"col": f"[{{{tp}}}, {{}}]", "row": f"[{{}}, {{{tp}}}]", "emb": f"[{{{tp}}}, {{}}]",
            "vec_col": f"[{{{tp}}}]", "vec": "[{}]"}[kind]


def layout_cases(sd, p):
    half = p // 2
    tp = max(1, p // 2)
    dp = p // tp
    cases = {}
    fsdp = "dp,tp" if dp > 1 else "tp"
    cases["reshard"] = dict(
        mesh=f"dp={dp},tp={tp}", ranks=None, dst_mesh=None, dst_ranks=None,
        items={n: (s, _tp_layout(k, len(s), "tp"),
                   f"[{{{fsdp}}}, {{}}]" if len(s) == 2 else f"[{{{fsdp}}}]")
               for n, (s, k) in sd.items()})
    if half >= 1 and p - half >= 1 and p >= 2:
        cases["sync"] = dict(
            mesh=f"t={half}", ranks=list(range(half)), dst_mesh=f"s={p - half}",
            dst_ranks=list(range(half, p)),
            items={n: (s, _tp_layout(k, len(s), "t"), "[{}, {s}]" if len(s) == 2 else "[{}]")
                   for n, (s, k) in sd.items()})
    return cases


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warm", action="store_true",
                        help="leave the heap as the runs before left it (default: free heap "
                             "memory given back before every timed run)")
    parser.add_argument("--out", action="store_true",
                        help="runs fill target blocks made in the warm-up (run(out=)); "
                             "bcast does not take them and is left out")
    parser.add_argument("--bucket", type=float, default=16.0, help="bcast bucket MiB")
    parser.add_argument("--workspace", type=float, default=None,
                        help="the group's W in MiB (default: the group's own default)")
    parser.add_argument("--cases", default="reshard,sync")
    parser.add_argument("--strategies", default="group,loop,unchecked,bcast,floor,patterns")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from mpi4py import MPI

    import mpiredist as mr
    from mpiredist.planning.pieces import layout_boxes

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    sd = state_dict(args.layers, args.hidden)
    rows, bad = [], 0
    wanted = args.cases.split(",")
    strategies = args.strategies.split(",")

    for name, case in layout_cases(sd, p).items():
        if name not in wanted:
            continue
        mesh = mr.Mesh(case["mesh"], ranks=case["ranks"])
        dst_mesh = mesh if case["dst_mesh"] is None else mr.Mesh(case["dst_mesh"],
                                                                ranks=case["dst_ranks"])
        items = {n: (s, "float32", src, dst) for n, (s, src, dst) in case["items"].items()}
        rng = np.random.default_rng(11)
        G = {n: rng.standard_normal(s).astype(np.float32) for n, (s, _, _, _) in items.items()}

        def block(n, which):
            shape, _, src, dst = items[n]
            m, lay = (mesh, src) if which == "src" else (dst_mesh, dst)
            box = layout_boxes(shape, m, mr.Layout.parse(lay), p)[rank]
            if box is None:
                return None
            return np.ascontiguousarray(G[n][tuple(slice(a, b) for a, b in box)])

        blocks = {n: block(n, "src") for n in items}
        want = {n: block(n, "dst") for n in items}
        total = sum(math.prod(s) * 4 for s, _, _, _ in items.values())
        made = {}

        def check(got, same=None):
            """Every rank's blocks right (collective); with ``same``, each one
            the block given as ``out``."""
            ok = all((want[n] is None and got[n] is None) or
                     (got[n] is not None and np.array_equal(got[n], want[n])) for n in items)
            if same is not None:
                ok = ok and all(same[n] is None or got[n] is same[n] for n in items)
            return comm.allreduce(int(ok), op=MPI.MIN) == 1

        def add(strategy, fn, calls_of, kept=lambda: 0, free=lambda: None, checked=True):
            """``fn(out)`` runs the strategy once (``out``: target blocks to fill,
            or None); warmed up and checked here, timed below."""
            made[strategy] = dict(fn=fn, calls=calls_of, kept=kept, free=free, checked=checked)

        if "group" in strategies:
            g = mr.TransferGroup(items, mesh, dst_mesh, workspace_bytes=None if args.workspace
                                 is None else int(args.workspace * (1 << 20)))
            before = [0]

            def run_group(out):
                before[0] = g.calls
                return g.run(blocks, out=out)
            add("group", run_group, lambda: g.calls - before[0], lambda: g.kept_bytes, g.free)
            bound = comm.allreduce(g.bound, op=MPI.MAX)
            buckets, workspace = g.buckets, g.workspace_bytes
        if "group-gloo" in strategies:
            torch_world = _gloo_world(comm)
            on_torch = (mr.Mesh(case["mesh"], comm=torch_world, ranks=case["ranks"]),
                        mr.Mesh((case["dst_mesh"] or case["mesh"]), comm=torch_world,
                                ranks=case["dst_ranks"] if case["dst_mesh"] else case["ranks"]))
            gg = mr.TransferGroup(items, *on_torch, workspace_bytes=None if args.workspace
                                  is None else int(args.workspace * (1 << 20)))
            before_gg = [0]

            def run_gloo(out):
                before_gg[0] = gg.calls
                return gg.run(blocks, out=out)
            add("group-gloo", run_gloo, lambda: gg.calls - before_gg[0], lambda: gg.kept_bytes,
                gg.free)
        for strategy, checked in (("loop", True), ("unchecked", False)):
            if strategy not in strategies:
                continue
            ts = {n: mr.Transfer(s, "float32", mesh, src, dst, dst_mesh=dst_mesh,
                                 checked=checked) for n, (s, _, src, dst) in items.items()}
            recs = []

            def run_loop(out, ts=ts, recs=recs):
                recs.clear()
                return {n: t.run(blocks[n], out=None if out is None else out[n], records=recs)
                        for n, t in ts.items()}
            add(strategy, run_loop, lambda recs=recs: sum(r.calls for r in recs),
                free=lambda ts=ts: [t.free() for t in ts.values()])
        if "bcast" in strategies and not args.out:
            add("bcast", *_bcast(comm, mesh, dst_mesh, items, G, blocks,
                                 int(args.bucket * (1 << 20))))
        floors = [(strategy, _floor_arrays(strategy, items, case, args.hidden))
                  for strategy in ("floor", "patterns") if strategy in strategies]
        for strategy, arrays in floors:
            # the floor is one (checked) Transfer; the pattern floor's
            # arrays skip the agreement, which a coalesced move makes once
            ts = [mr.Transfer(shape, "float32", mesh, src, dst, dst_mesh=dst_mesh,
                              checked=strategy == "floor") for shape, src, dst in arrays]
            ones = [None if t.source_shape is None else np.ones(t.source_shape, np.float32)
                    for t in ts]
            recs = []

            def run_floor(out, ts=ts, ones=ones, recs=recs):
                recs.clear()
                return [t.run(x, out=None if out is None else o, records=recs)
                        for t, x, o in zip(ts, ones, out or [None] * len(ts))]
            add(strategy, run_floor, lambda recs=recs: sum(r.calls for r in recs),
                free=lambda ts=ts: [t.free() for t in ts], checked=False)

        results = _measure(comm, made, check, args)
        base = results.get("group", {}).get("ms")
        for strategy, r in results.items():
            bad += not r["ok"]
            rows.append(dict(case=name, strategy=strategy, tensors=len(items),
                             mib=total / 2**20, **r,
                             x_group=(r["ms"] / base) if base else None,
                             bound=bound if "group" in results else None,
                             buckets=buckets if "group" in results else None,
                             workspace=workspace if "group" in results else None))
    if rank == 0:
        _report(args, p, rows)
    return 1 if bad else 0


def _gloo_world(comm):
    """torch.distributed's default group (gloo) over the MPI ranks, as a transport
    group (made once)."""
    import socket

    import torch.distributed as dist

    from mpiredist.runtime import torchdist
    if not dist.is_initialized():
        port = None
        if comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{comm.bcast(port)}",
                                rank=comm.Get_rank(), world_size=comm.Get_size())
    return torchdist.world()


def _measure(comm, made, check, args):
    """``{strategy: figures}`` of the strategies ``made`` (collective): each warmed
    up and checked, then timed side by side, then its peak memory (tracemalloc
    and RSS, plus what it keeps between runs) and MPI calls in one more run
    each; then each is freed."""
    from mpi4py import MPI

    from mpiredist.bench.measure import rss_peak, rss_supported, traced_peak, trim_heap
    from mpiredist.runtime.timing import slowest_medians

    results = {}
    runners, oks, filled = {}, {}, {}
    for strategy, m in made.items():
        got = m["fn"](None)                                  # warm-up, checked
        oks[strategy] = check(got) if m["checked"] else True
        if args.out:                # the warm-up's results are the blocks to fill
            filled[strategy] = got
            runners[strategy] = lambda m=m, got=got: m["fn"](got)
        else:
            runners[strategy] = lambda m=m: m["fn"](None)
        del got
    seconds = slowest_medians(comm, runners, args.repeats,    # side by side
                              before=None if args.warm else trim_heap)
    for strategy, got in filled.items():    # one more run into spoiled blocks
        if made[strategy]["checked"]:
            for block in got.values():
                if block is not None:
                    block[...] = np.nan
            again = made[strategy]["fn"](got)
            oks[strategy] = oks[strategy] and check(again, same=got)
    filled.clear()
    for strategy, m in made.items():
        fn = runners[strategy]
        # what a strategy keeps between runs (made in the warm-up) counts too
        with traced_peak() as e:
            fn()
        peak = comm.allreduce(e.bytes + m["kept"](), op=MPI.MAX)
        calls = comm.allreduce(m["calls"](), op=MPI.MAX)
        rss = None
        if rss_supported():
            comm.Barrier()
            with rss_peak() as r:
                fn()
            rss = comm.allreduce(r.bytes + m["kept"](), op=MPI.MAX)
        results[strategy] = dict(ms=seconds[strategy] * 1e3, calls=calls,
                                 peak=peak, rss=rss, ok=oks[strategy])
    runners.clear()
    for m in made.values():
        m["free"]()
    return results


def _bcast(comm, mesh, dst_mesh, items, G, blocks, limit):
    """``(fn, calls_of, kept, free)`` of the broadcast baseline: each tensor gathered
    whole on the source group (or held whole by the source root between
    meshes), buckets of ``limit`` bytes ``Bcast`` from rank 0, every target
    rank copying its block out."""
    import mpiredist as mr
    from mpiredist.planning.pieces import layout_boxes

    rank, p = comm.Get_rank(), comm.Get_size()
    calls = [0]
    gathers = {n: mr.Transfer(s, "float32", mesh, src, str(mr.Layout.replicated(len(s))))
               for n, (s, _, src, _) in items.items()} if mesh.ranks is None else {}
    names = list(items)
    root = 0

    def run(_out):
        calls[0] = 0
        out, k = {}, 0
        while k < len(names):
            chunk, size = [], 0
            while k < len(names) and (not chunk or size + G[names[k]].nbytes <= limit):
                chunk.append(names[k])
                size += G[names[k]].nbytes
                k += 1
            buf = np.empty(size // 4, np.float32)
            if mesh.ranks is None:          # gather over the source group first
                at = 0
                for n in chunk:
                    recs = []
                    whole = gathers[n].run(blocks[n], records=recs)
                    calls[0] += sum(r.calls for r in recs)
                    if rank == root:
                        buf[at:at + whole.size] = whole.reshape(-1)
                    at += whole.size
                    del whole
            elif rank == root:              # the training ranks' root holds them
                at = 0
                for n in chunk:
                    buf[at:at + G[n].size] = G[n].reshape(-1)
                    at += G[n].size
            comm.Bcast(buf, root=root)
            calls[0] += 1
            at = 0
            for n in chunk:
                shape = items[n][0]
                whole = buf[at:at + G[n].size].reshape(shape)
                box = layout_boxes(shape, dst_mesh, mr.Layout.parse(items[n][3]), p)[rank]
                out[n] = None if box is None else np.ascontiguousarray(
                    whole[tuple(slice(a, b) for a, b in box)])
                at += G[n].size
            del buf
        return out
    return run, lambda: calls[0], lambda: 0, lambda: [t.free() for t in gathers.values()]


def _floor_arrays(strategy, items, case, hidden):
    """``[(shape, src, dst)]`` of a floor's single arrays.  ``floor``: the block
    rows of every tensor stacked, ``[{tp}, {}]`` to the first dim's target;
    ``patterns``: one array per layout pair, of those tensors' bytes,
    ``(elements / hidden, hidden)`` for the 2-D ones, flat for the vectors."""
    if strategy == "floor":
        total = sum(math.prod(s) for s, _, _, _ in items.values())
        src = "[{tp}, {}]" if "tp" in case["mesh"] else "[{t}, {}]"
        return [((total // hidden, hidden), src, items["embed.weight"][3])]
    pairs = {}
    for shape, _, src, dst in items.values():
        pairs[(len(shape), src, dst)] = pairs.get((len(shape), src, dst), 0) + math.prod(shape)
    return [((n // hidden, hidden) if nd == 2 else (n,), src, dst)
            for (nd, src, dst), n in pairs.items()]


def _report(args, p, rows):
    """Print the table and, per case, the issue's targets with the figures."""
    print(f"many arrays: {p} ranks, {args.layers} layers, hidden {args.hidden}, "
          f"median of {args.repeats} side by side, "
          f"{'into out= blocks' if args.out else 'new results'}, "
          f"{'warm heap' if args.warm else 'heap trimmed before each run'}, group W "
          f"{'default' if args.workspace is None else f'{args.workspace:g} MiB'}")
    print(f"{'case':8} {'strategy':10} {'tensors':>7} {'MiB':>7} {'ms':>9} {'x group':>8} "
          f"{'calls':>6} {'peak MiB':>9} {'RSS MiB':>8} {'bound MiB':>9} check")
    for r in rows:
        xg = "-" if r["x_group"] is None else f"{r['x_group']:.2f}"
        bd = "-" if r["bound"] is None else f"{r['bound'] / 2**20:.2f}"
        rs = "-" if r["rss"] is None else f"{r['rss'] / 2**20:.2f}"
        print(f"{r['case']:8} {r['strategy']:10} {r['tensors']:>7} {r['mib']:>7.1f} "
              f"{r['ms']:>9.2f} {xg:>8} {r['calls']:>6} {r['peak'] / 2**20:>9.2f} "
              f"{rs:>8} {bd:>9} {'ok' if r['ok'] else 'FAIL'}")
    for case in {r["case"] for r in rows}:
        by = {r["strategy"]: r for r in rows if r["case"] == case}
        if "group" not in by:
            continue
        g = by["group"]
        parts = [f"{case}: group in {g['buckets']} bucket(s) within W "
                 f"{g['workspace'] / 2**20:.2f} MiB"]
        if "loop" in by:
            x = by["loop"]["ms"] / g["ms"]
            parts.append(f"{x:.1f}x faster than the checked loop (target 5x: "
                         f"{'met' if x >= 5 else 'MISSED'})")
        if "floor" in by:
            x = g["ms"] / by["floor"]["ms"]
            parts.append(f"{x:.2f}x the single-array floor (target 1.3x: "
                         f"{'met' if x <= 1.3 else 'MISSED'})")
        if "patterns" in by:
            parts.append(f"{g['ms'] / by['patterns']['ms']:.2f}x the floor by pattern "
                         "(no target: one array per layout pair)")
        if "bcast" in by:
            x = by["bcast"]["ms"] / g["ms"]
            parts.append(f"{x:.1f}x faster than bcast at {g['peak'] / by['bcast']['peak']:.2f}"
                         f" of its peak ({'met' if x > 1 else 'MISSED'})")
        parts.append(f"peak {g['peak'] / 2**20:.2f} MiB (tracemalloc) within the bound "
                     f"{g['bound'] / 2**20:.2f} MiB: "
                     f"{'met' if g['peak'] <= g['bound'] else 'MISSED'}")
        if g["rss"] is not None:
            parts.append(f"RSS growth {g['rss'] / 2**20:.2f} MiB (bound + 1 MiB: "
                         f"{'met' if g['rss'] <= g['bound'] + (1 << 20) else 'MISSED'})")
        print("; ".join(parts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
