"""``python -m mpiredist.bench --nodes`` (bench/nodes.py) under MPI.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_bench_nodes.py

On one machine the nodes are made up (ranks split in two halves); the
cluster stage (scripts/cluster_ci.sh) runs the bench itself across real
nodes.  Needs an even number of ranks, at least 4; the shared cases run at 8.
"""

import json

import pytest
from helpers import all_ok, need_ranks, shared_path

import mpiredist as mr
from mpiredist.bench import multinode as nodes
from mpiredist.bench.__main__ import build_parser

pytestmark = pytest.mark.mpi


def _halves(comm):
    need_ranks(comm, 4)
    if comm.size % 2:
        pytest.skip("two nodes of equal size need an even number of ranks")
    return mr.Topology([2 * r // comm.size for r in range(comm.size)])


def test_orientations_put_the_major_or_the_minor_digits_across_nodes(comm):
    t = _halves(comm)
    major, minor = nodes.node_order(t, "major"), nodes.node_order(t, "minor")
    per = comm.size // 2
    all_ok(comm, [t.node(r) for r in major] == [d // per for d in range(comm.size)]
           and [t.node(r) for r in minor] == [d % 2 for d in range(comm.size)]
           and sorted(major) == sorted(minor) == list(range(comm.size)),
           f"{major} {minor}")


def test_the_nodes_bench_runs_every_case_correctly(comm):
    t = _halves(comm)
    cases = "c01,c02,c11,c12,t2s,fsdp2s" if comm.size == 8 else "t2s,fsdp2s"
    with shared_path(comm) as path:
        args = build_parser().parse_args(["--nodes", "--scale", "64", "--repeats", "1",
                                          "--cases", cases, "--link-rate", "1gbit",
                                          "--no-progress", "--json", path])
        rc = nodes.run(comm, args, topology=t)
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    records = doc["records"]
    labels = [r["case"] for r in records]
    want = ["t2s", "fsdp2s"] + (["c01 major", "c01 minor", "c02 major", "c02 minor",
                                 "c11 major", "c11 minor", "c12 major", "c12 minor"]
                                if comm.size == 8 else [])
    all_ok(comm, rc == 0 and sorted(labels) == sorted(want), f"rc {rc}, cases {labels}")
    all_ok(comm, all(r["correct"] for r in records), f"{records}")
    # every byte of train-to-serve crosses: the busiest node lacks the whole array
    t2s = next(r for r in records if r["case"] == "t2s")
    n = t2s["shape"][0] * t2s["shape"][1] * 4
    all_ok(comm, t2s["limit_bytes"] == n and t2s["limit_s"] == pytest.approx(n / 1.25e8),
           f"{t2s}")
    for r in records:
        s = r["strategies"]["mpiredist"]
        if s["across_bytes_per_rank"] is not None:
            all_ok(comm, s["across_bytes_per_rank"] >= r["across_bound_per_rank"], f"{r}")
    all_ok(comm, doc["summary"]["link"] and doc["topology"] == str(t), f"{doc['summary']}")


def test_link_rates_parse_as_tc_writes_them():
    assert nodes.parse_rate("1gbit") == 1e9
    assert nodes.parse_rate("500mbit") == 5e8
    assert nodes.parse_rate("2.5e6") == 2.5e6
    for bad in ("fast", "-1gbit", "0"):
        with pytest.raises(ValueError):
            nodes.parse_rate(bad)


def test_a_bad_link_rate_is_refused_by_the_command(comm, capsys):
    """``python -m mpiredist.bench --nodes --link-rate fast``: exit status 2 and
    one line on rank 0, before anything runs (the command line, not only
    parse_rate: a renamed module left this path raising NameError)."""
    from mpiredist.bench.__main__ import main
    rc = main(["--nodes", "--link-rate", "fast", "--no-progress"], comm=comm)
    err = capsys.readouterr().err
    all_ok(comm, rc == 2, f"rc {rc}")
    all_ok(comm, ("link rate 'fast'" in err) == (comm.rank == 0), err)
