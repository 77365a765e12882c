"""Checkpoint bench: mpiredist's save/load against PyTorch DCP and mpiredist's HDF5 route.

The state is transformer-like: 242 float32 tensors, 255 MiB (an embedding
32000 x 512, 24 layers of four 512 x 512 attention weights, two MLP weights
1024 x 512 and 512 x 1024, two norms and two biases, a final norm).  Each
scenario saves from one layout and rank count and loads on another, every
step in a fresh job:

    8 Shard(0) -> 8 Shard(0);  2 Shard(0) -> 8 Shard(0);  8 Shard(0) -> 8 Shard(1)
    (2-D weights; 1-D ones stay Shard(0));  8 Shard(0) -> 3 Shard(0) (uneven);
    1 rank, full tensors -> 8 Shard(0)

One job (run by the driver, or by hand)::

    mpiexec -n 8 python benchmarks/checkpoint.py save  --system mpiredist --path P --layout shard0
    mpiexec -n 8 python benchmarks/checkpoint.py load  --system mpiredist --path P --layout shard1

The driver runs every scenario, each step ``--repeats`` times as fresh jobs
(page cache dropped before every load where ``/proc/sys/vm/drop_caches`` is
writable), and prints one table of medians::

    python benchmarks/checkpoint.py drive --repeats 3 [--systems mpiredist,dcp,hdf5]

The driver interleaves the systems (repeat 1 of each, then repeat 2, ...).
Figures per load job, max over ranks: time of the load call; peak RSS growth
during it over T (this rank's target bytes; mpiredist and HDF5 make new
arrays, so T is inside the growth; DCP fills DTensors allocated before);
E = transient memory beyond the targets (growth - T for new arrays, growth
for DCP); rchar (``/proc/self/io``) over T, and the index or metadata bytes.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LAYERS, DIM, VOCAB, HIDDEN = 24, 512, 32000, 1024
SCENARIOS = [("8 S0 -> 8 S0", 8, "shard0", 8, "shard0"),
             ("2 S0 -> 8 S0", 2, "shard0", 8, "shard0"),
             ("8 S0 -> 8 S1", 8, "shard0", 8, "shard1"),
             ("8 S0 -> 3 S0", 8, "shard0", 3, "shard0"),
             ("1 full -> 8 S0", 1, "full", 8, "shard0")]
RSS_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "NUMPY_MADVISE_HUGEPAGE": "0"}


def tensors():
    """``[(name, shape)]`` of the state, 242 tensors."""
    out = [("emb", (VOCAB, DIM))]
    for i in range(LAYERS):
        p = f"layers.{i}."
        out += [(p + w, (DIM, DIM)) for w in ("wq", "wk", "wv", "wo")]
        out += [(p + "w1", (HIDDEN, DIM)), (p + "w2", (DIM, HIDDEN)), (p + "norm1", (DIM,)),
                (p + "norm2", (DIM,)), (p + "b1", (HIDDEN,)), (p + "b2", (DIM,))]
    out.append(("norm", (DIM,)))
    return out


def dim_of(shape, layout):
    """The sharded dim of ``shape`` under ``layout`` (None: not sharded)."""
    if layout == "full":
        return None
    return 1 if layout == "shard1" and len(shape) == 2 else 0


def box_of(shape, dim, k, p):
    """Rank ``p``'s box of ``k`` along ``dim`` (the block rule)."""
    box = [(0, n) for n in shape]
    if dim is not None:
        c = -(-shape[dim] // k)
        box[dim] = (min(p * c, shape[dim]), min((p + 1) * c, shape[dim]))
    return box


def values(t, shape, box):
    """The values of tensor number ``t`` in ``box``: cheap to make, distinct."""
    flat = np.zeros([hi - lo for lo, hi in box], dtype=np.float64)
    stride = 1
    for d in reversed(range(len(shape))):
        lo, hi = box[d]
        idx = np.arange(lo, hi, dtype=np.float64).reshape(
            [-1 if e == d else 1 for e in range(len(shape))])
        flat += idx * stride
        stride *= shape[d]
    return (((flat + 7919 * t) % 65521) / 256).astype(np.float32)


def rchar():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def drop_caches(comm):
    """Every rank's page cache dropped (rank 0 does it; a barrier); False where not allowed."""
    ok = False
    if comm.rank == 0:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            ok = True
        except OSError:
            ok = False
    return comm.bcast(ok)


# ------------------------------------------------------------------ one job

def _gloo(comm):
    import torch.distributed as dist
    if not dist.is_initialized():
        port = None
        if comm.rank == 0:
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = comm.bcast(port)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=comm.rank, world_size=comm.size)


def _blocks(comm, layout, make):
    """``{name: (shape, box, block)}`` of this rank (``make``: fill values or zeros)."""
    out = {}
    for t, (name, shape) in enumerate(tensors()):
        dim = dim_of(shape, layout)
        if layout == "full" and comm.rank != 0:
            continue
        box = box_of(shape, dim, comm.size, comm.rank)
        out[name] = (t, shape, dim, box, values(t, shape, box) if make else
                     np.zeros([hi - lo for lo, hi in box], dtype=np.float32))
    return out


def _mpiredist_state(comm, layout, blocks, new=False):
    import mpiredist as mr
    mesh = mr.Mesh({"x": comm.size}) if layout != "full" else mr.Mesh({"x": 1}, ranks=[0])
    state = {}
    for name, (t, shape, dim, box, block) in blocks.items() if not new else ():
        lay = "[" + ", ".join("{x}" if d == dim else "{}" for d in range(len(shape))) + "]"
        state[name] = mr.DistArray(block, shape, mr.Layout.parse(lay), mesh)
    if layout == "full" and comm.rank != 0:
        for t, (name, shape) in enumerate(tensors()):
            lay = "[" + ", ".join("{x}" if d == 0 else "{}" for d in range(len(shape))) + "]"
            state[name] = mr.DistArray(None, shape, mr.Layout.parse(lay), mesh)
    return mesh, state


def _dtensors(comm, layout, blocks):
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    mesh = DeviceMesh("cpu", torch.arange(comm.size), mesh_dim_names=("x",))
    out = {}
    for name, (t, shape, dim, box, block) in blocks.items():
        place = [Replicate()] if dim is None else [Shard(dim)]
        out[name] = DTensor.from_local(torch.from_numpy(block), mesh, place, run_check=False,
                                       shape=torch.Size(shape), stride=_strides(shape))
    return out


def _strides(shape):
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return tuple(reversed(out))


def job_save(args, comm):
    system = args.system
    if system == "dcp" and args.layout == "full" and comm.size != 1:
        raise SystemExit("the full-tensor save runs at 1 rank")
    blocks = _blocks(comm, args.layout, make=True)
    if system == "dcp":
        _gloo(comm)
        import torch.distributed.checkpoint as dcp
        state = _dtensors(comm, args.layout, blocks)
        comm.Barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=args.path)
        dt = time.perf_counter() - t0
    elif system == "mpiredist":
        import mpiredist as mr
        _, state = _mpiredist_state(comm, args.layout, blocks)
        comm.Barrier()
        t0 = time.perf_counter()
        mr.save(args.path, state)
        dt = time.perf_counter() - t0
    else:
        import mpiredist as mr
        from mpiredist.arrays.hdf5 import write_blocks
        mesh, state = _mpiredist_state(comm, args.layout, blocks)
        file = os.path.join(args.path, "state.h5")
        if comm.rank == 0:
            os.makedirs(args.path, exist_ok=True)
        comm.Barrier()
        t0 = time.perf_counter()
        for name, a in state.items():
            write_blocks(file, name, a.local if a.local is not None else
                         np.zeros((0,) * len(a.shape), np.float32), a.shape, mesh, a.layout,
                         comm, overwrite=False)
        dt = time.perf_counter() - t0
    dt = comm.allreduce(dt, op=_max())
    comm.Barrier()
    return {"save_s": dt, "disk_bytes": _du(args.path) if comm.rank == 0 else None}


def _max():
    from mpi4py import MPI
    return MPI.MAX


def _du(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def job_load(args, comm):
    from mpiredist.bench.measure import rss_peak
    system = args.system
    blocks = _blocks(comm, args.layout, make=False)           # the targets' geometry
    t_bytes = sum(b[4].nbytes for b in blocks.values())
    import mpiredist as mr
    if system == "dcp":
        _gloo(comm)
        import torch.distributed.checkpoint as dcp
        state = _dtensors(comm, args.layout, blocks)             # targets allocated before
    elif system in ("mpiredist", "mpiredist-dcp"):
        mesh = mr.Mesh({"x": comm.size})
        targets = {name: (mesh, "[" + ", ".join("{x}" if d == dim else "{}"
                                                for d in range(len(shape))) + "]")
                   for name, (t, shape, dim, box, _) in blocks.items()}
        index = os.path.join(args.path, "gen-000001", "index.json") \
            if system == "mpiredist" else os.path.join(args.path, ".metadata")
    else:
        from mpiredist.arrays.hdf5 import read_block
        mesh = mr.Mesh({"x": comm.size})
        file = os.path.join(args.path, "state.h5")
    for b in list(blocks):                                      # drop the zeros (not DCP's)
        if system != "dcp":
            blocks[b] = blocks[b][:4] + (None,)
    dropped = drop_caches(comm)
    comm.Barrier()
    before = rchar()
    with rss_peak() as e:
        t0 = time.perf_counter()
        if system == "dcp":
            dcp.load(state, checkpoint_id=args.path)
            got = {k: v.to_local().numpy() for k, v in state.items()}
        elif system in ("mpiredist", "mpiredist-dcp"):
            out = mr.load(args.path, targets)
            got = {k: v.local for k, v in out.items()}
        else:
            got = {}
            for name, (t, shape, dim, box, _) in blocks.items():
                lay = "[" + ", ".join("{x}" if d == dim else "{}" for d in range(len(shape))) \
                    + "]"
                got[name] = read_block(file, name, mesh, lay, comm)[0]
        dt = time.perf_counter() - t0
    read = rchar() - before
    ok = all(np.array_equal(got[name], values(t, shape, box))
             for name, (t, shape, dim, box, _) in blocks.items())
    growth = e.bytes or 0
    transient = growth if system == "dcp" else growth - t_bytes
    meta = 0
    if system in ("mpiredist", "mpiredist-dcp"):
        meta = os.path.getsize(index)
    elif system == "dcp":
        meta = os.path.getsize(os.path.join(args.path, ".metadata"))
    rows = comm.gather({"load_s": dt, "rss_t": growth / t_bytes, "e_t": transient / t_bytes,
                        "e_bytes": transient, "rchar_t": read / t_bytes,
                        "rchar_idx_t": (read - meta) / t_bytes, "t_bytes": t_bytes,
                        "ok": ok}, root=0)
    if comm.rank != 0:
        return None
    out = {k: max(r[k] for r in rows) for k in rows[0] if k != "ok"}
    out.update(ok=all(r["ok"] for r in rows), dropped=dropped, meta_bytes=meta)
    return out


def run_job(argv=None):
    from mpi4py import MPI
    args = _parser().parse_args(argv)
    comm = MPI.COMM_WORLD
    result = job_save(args, comm) if args.role == "save" else job_load(args, comm)
    if comm.rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    if comm.rank == 0:
        print(json.dumps(result), flush=True)


# ------------------------------------------------------------------ driver

def _launch(n, argv, env):
    cmd = [_mpiexec(), "-n", str(n), sys.executable, str(Path(__file__).resolve()), *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"job failed ({done.returncode}): {' '.join(cmd)}\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mpiexec():
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def drive(args):
    """Every scenario, each step ``args.repeats`` fresh jobs, the systems
    interleaved (repeat 1 of each system, then repeat 2, ...), so that a
    machine shared with other work slows them alike; one table of medians."""
    env = dict(os.environ, **RSS_ENV, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    systems = args.systems.split(",")
    readers = systems + (["mpiredist-dcp"] if args.mpiredist_on_dcp and "dcp" in systems
                         else [])
    scenarios = [s for s in SCENARIOS if not args.only or args.only in s[0]]
    base = Path(tempfile.mkdtemp(prefix="mpiredist-ckbench-", dir=args.dir))
    rows = []
    try:
        for key in dict.fromkeys((sn, slay) for _, sn, slay, _, _ in scenarios):
            sn, slay = key
            saves = {system: [] for system in systems}
            for r in range(args.repeats):
                for system in systems:
                    path = base / f"{system}-{sn}-{slay}"
                    shutil.rmtree(path, ignore_errors=True)
                    saves[system].append(_try(sn, ["save", "--system", system, "--path",
                                                   str(path), "--layout", slay], env))
            for name, _, _, ln, llay in (s for s in scenarios if (s[1], s[2]) == key):
                loads = {system: [] for system in readers}
                for r in range(args.repeats):
                    for system in readers:
                        source = "dcp" if system == "mpiredist-dcp" else system
                        path = base / f"{source}-{sn}-{slay}"
                        loads[system].append(_try(ln, ["load", "--system", system, "--path",
                                                       str(path), "--layout", llay], env))
                for system in readers:
                    source = "dcp" if system == "mpiredist-dcp" else system
                    sruns = [x for x in saves[source] if x]
                    lruns = [x for x in loads[system] if x]
                    if sruns and lruns:
                        rows.append(_row(system, name, sruns, lruns))
                        print(json.dumps(rows[-1]), flush=True)
            for system in systems:
                shutil.rmtree(base / f"{system}-{sn}-{slay}", ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _try(n, argv, env):
    """A job's result, or None (its failure reported) so that the others go on."""
    try:
        return _launch(n, argv, env)
    except RuntimeError as exc:
        print(str(exc)[:2000], file=sys.stderr, flush=True)
        return None


def _row(system, name, sruns, lruns):
    """The table's row: medians over the jobs."""
    row = {"system": system, "scenario": name,
           "save_s": statistics.median(r["save_s"] for r in sruns),
           "disk_MiB": sruns[-1]["disk_bytes"] / 2**20}
    for k in ("load_s", "rss_t", "e_t", "rchar_t", "rchar_idx_t"):
        row[k] = statistics.median(r[k] for r in lruns)
    row["e_MiB"] = statistics.median(r["e_bytes"] for r in lruns) / 2**20
    row["T_MiB"] = lruns[0]["t_bytes"] / 2**20
    row["w_MiB"] = row["T_MiB"] / 4 + 1
    row["ok"] = all(r["ok"] for r in lruns)
    row["dropped"] = all(r["dropped"] for r in lruns)
    row["meta_KiB"] = lruns[0]["meta_bytes"] / 1024
    return row


def _table(rows):
    head = ["scenario", "system", "save s", "load s", "RSS/T", "E/T", "E MiB", "rchar/T",
            "(- index)", "index KiB", "disk MiB", "T MiB", "ok"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in sorted(rows, key=lambda r: ([s[0] for s in SCENARIOS].index(r["scenario"]),
                                         r["system"])):
        print(f"| {r['scenario']} | {r['system']} | {r['save_s']:.2f} | {r['load_s']:.2f} | "
              f"{r['rss_t']:.2f} | {r['e_t']:.2f} | {r['e_MiB']:.1f} | {r['rchar_t']:.2f} | "
              f"{r['rchar_idx_t']:.2f} | {r['meta_KiB']:.0f} | {r['disk_MiB']:.1f} | "
              f"{r['T_MiB']:.1f} | {'yes' if r['ok'] else 'NO'} |")
    if rows and not all(r["dropped"] for r in rows):
        print("(the page cache could not be dropped before some loads)")


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=["save", "load", "drive"])
    p.add_argument("--system", choices=["mpiredist", "dcp", "hdf5", "mpiredist-dcp"], default="mpiredist")
    p.add_argument("--path")
    p.add_argument("--layout", choices=["shard0", "shard1", "full"], default="shard0")
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--systems", default="mpiredist,dcp,hdf5")
    p.add_argument("--only", help="run the scenarios whose name contains this")
    p.add_argument("--dir", help="where the checkpoints go (default: the temp dir)")
    p.add_argument("--mpiredist-on-dcp", action="store_true",
                   help="also load DCP's checkpoints with mr.load (row mpiredist-dcp)")
    return p


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "drive":
        drive(_parser().parse_args())
    else:
        run_job()
