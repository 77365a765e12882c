"""Many arrays: a transformer-like state dict resharded and synced, group against loops.

    mpiexec -n 8 python -m mpiredist.bench.many [--layers 24] [--hidden 256]
        [--repeats 5] [--json FILE]

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

Strategies, each timed after a warm-up (median over ``--repeats`` of the
slowest rank):

``group``      one :class:`~mpiredist.TransferGroup` made once, ``g.run(blocks)``;
``loop``       one checked :class:`~mpiredist.Transfer` per tensor, made once,
               each ``t.run(block)`` in turn (what a per-parameter loop does);
``unchecked``  the same with ``checked=False`` (no agreement per run);
``bcast``      what RL weight-sync code does: each tensor gathered whole on
               the source group (mpiredist all-gather to ``[{}, ...]``), the
               whole tensors packed into buckets of ``--bucket`` MiB on the
               first source rank, each bucket ``Bcast`` to every rank, and
               every target rank copying its block out;
``floor``      one Transfer of a single float32 array of the same bytes (the
               block rows of every tensor stacked: ``[{tp}, {}]`` to the
               target layout of the first dim): what coalescing can at best
               reach.

Columns: median milliseconds, ``x group`` (the strategy's time over the
group's), MPI calls that move data per run on the slowest rank (group:
``TransferGroup.calls``; Transfers: their StepRecords; bcast: its calls),
peak MiB per rank (tracemalloc of one untimed run, max over ranks; the
result included, and what the group keeps between runs, its bucket buffer:
``TransferGroup.kept_bytes``), the growth of the peak resident set in one
more run (``RSS MiB``, MPI's buffers included, plus the kept buffer;
meaningful with the allocator settings of
``mpiredist.bench.memory.RSS_ENVIRONMENT``) and the group's bound
sum max(S_i, T_i) + W.  The targets
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


def _cases(sd, p):
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
    parser.add_argument("--bucket", type=float, default=16.0, help="bcast bucket MiB")
    parser.add_argument("--cases", default="reshard,sync")
    parser.add_argument("--strategies", default="group,loop,unchecked,bcast,floor")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from mpi4py import MPI

    import mpiredist as mr
    from .memory import rss_peak, rss_supported, traced_peak
    from .timing import slowest_median
    from ..planning.pieces import layout_boxes

    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    sd = state_dict(args.layers, args.hidden)
    rows, bad = [], 0
    wanted = args.cases.split(",")
    strategies = args.strategies.split(",")

    for name, case in _cases(sd, p).items():
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
        results = {}

        def check(got):
            ok = all((want[n] is None and got[n] is None) or
                     (got[n] is not None and np.array_equal(got[n], want[n])) for n in items)
            return comm.allreduce(int(ok), op=MPI.MIN) == 1

        def record(strategy, fn, calls_of, kept=lambda: 0):
            got = fn()                                          # warm-up, checked
            ok = check(got) if got is not None else True
            seconds = slowest_median(comm, fn, args.repeats)
            # what a strategy keeps between runs (made in the warm-up) counts too
            with traced_peak() as e:
                fn()
            peak = comm.allreduce(e.bytes + kept(), op=MPI.MAX)
            calls = comm.allreduce(calls_of(), op=MPI.MAX)
            rss = None
            if rss_supported():
                comm.Barrier()
                with rss_peak() as r:
                    fn()
                rss = comm.allreduce(r.bytes + kept(), op=MPI.MAX)
            results[strategy] = dict(ms=seconds * 1e3, calls=calls, peak=peak, rss=rss, ok=ok)

        if "group" in strategies:
            g = mr.TransferGroup(items, mesh, dst_mesh)
            before = [0]

            def run_group():
                before[0] = g.calls
                return g.run(blocks)
            record("group", run_group, lambda: g.calls - before[0], lambda: g.kept_bytes)
            bound = comm.allreduce(g.bound, op=MPI.MAX)
            buckets = len(g._buckets)
        for strategy, checked in (("loop", True), ("unchecked", False)):
            if strategy not in strategies:
                continue
            ts = {n: mr.Transfer(s, "float32", mesh, src, dst, dst_mesh=dst_mesh,
                                 checked=checked) for n, (s, _, src, dst) in items.items()}
            recs = []

            def run_loop(ts=ts, recs=recs):
                recs.clear()
                return {n: t.run(blocks[n], records=recs) for n, t in ts.items()}
            record(strategy, run_loop, lambda recs=recs: sum(r.calls for r in recs))
            for t in ts.values():
                t.free()
        if "bcast" in strategies:
            calls = [0]
            full_on = [mr.Layout.replicated(len(s)) for s, _, _, _ in items.values()]
            gathers = {n: mr.Transfer(s, "float32", mesh, src, str(lay))
                       for (n, (s, _, src, _)), lay in zip(items.items(), full_on)} \
                if mesh.ranks is None else {}
            limit = int(args.bucket * (1 << 20))
            names = list(items)
            root = 0

            def run_bcast():
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
                        box = layout_boxes(shape, dst_mesh, mr.Layout.parse(items[n][3]),
                                           p)[rank]
                        out[n] = None if box is None else np.ascontiguousarray(
                            whole[tuple(slice(a, b) for a, b in box)])
                        at += G[n].size
                    del buf
                return out
            record("bcast", run_bcast, lambda: calls[0])
            for t in gathers.values():
                t.free()
        if "floor" in strategies:
            cols = args.hidden
            rows_ = total // 4 // cols
            src = "[{tp}, {}]" if "tp" in case["mesh"] else "[{t}, {}]"
            dst = items["embed.weight"][3]
            t = mr.Transfer((rows_, cols), "float32", mesh, src, dst, dst_mesh=dst_mesh)
            local = None if t.source_shape is None else np.ones(t.source_shape, np.float32)
            recs = []

            def run_floor():
                recs.clear()
                t.run(local, records=recs)
                return None
            record("floor", run_floor, lambda: sum(r.calls for r in recs))
            t.free()
        base = results.get("group", {}).get("ms")
        for strategy, r in results.items():
            bad += not r["ok"]
            rows.append(dict(case=name, strategy=strategy, tensors=len(items),
                             mib=total / 2**20, **r,
                             x_group=(r["ms"] / base) if base else None,
                             bound=bound if "group" in results else None,
                             buckets=buckets if "group" in results else None))
    if rank == 0:
        print(f"many arrays: {p} ranks, {args.layers} layers, hidden {args.hidden}, "
              f"median of {args.repeats}")
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
            parts = [f"{case}: group in {g['buckets']} bucket(s)"]
            if "loop" in by:
                x = by["loop"]["ms"] / g["ms"]
                parts.append(f"{x:.1f}x faster than the checked loop (target 5x: "
                             f"{'met' if x >= 5 else 'MISSED'})")
            if "floor" in by:
                x = g["ms"] / by["floor"]["ms"]
                parts.append(f"{x:.2f}x the single-array floor (target 1.3x: "
                             f"{'met' if x <= 1.3 else 'MISSED'})")
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
