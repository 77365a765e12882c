"""``python -m mpiredist calibrate`` under MPI: a complete profile the planner reads.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_calibrate.py
"""

import json

import pytest
from helpers import all_ok, shared_path

import mpiredist as mr
from mpiredist import cli
from mpiredist.runtime.calibrate import _groups
from mpiredist.planning import profile as profiles

pytestmark = pytest.mark.mpi


def test_calibrate_writes_a_complete_profile(comm, monkeypatch):
    with shared_path(comm) as path:
        rc = cli.main(["calibrate", "--quick", "--json", path])
        all_ok(comm, rc == 0, f"calibrate exit status {rc}")
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        sizes = {str(g) for g in _groups(comm.size)}
        complete = (set(doc["beta"]) == set(profiles.OPS)
                    and all(set(v) == sizes for v in doc["beta"].values())
                    and all(b > 0 for v in doc["beta"].values() for b in v.values())
                    and doc["alpha"] >= 0 and doc["ranks"] == comm.size
                    and min(doc["pack_rate"], doc["datatype_rate"], doc["memory_bandwidth"]) > 0)
        all_ok(comm, complete, f"profile incomplete: {sorted(doc)} {doc.get('beta')}")
        monkeypatch.setenv(profiles.ENV, path)
        prof = profiles.current()
        all_ok(comm, prof.alpha == doc["alpha"] and prof.source == path,
               "the planner reads MPIREDIST_PROFILE")
        p = mr.plan((64, 64), "float32", {"x": comm.size}, "[{x},{}]", "[{},{x}]")
        all_ok(comm, p.peak_local_bytes <= max(p.src_local_bytes, p.dst_local_bytes),
               "a plan under the measured profile keeps the bound")


def test_ranks_with_different_profiles_raise_together(comm, monkeypatch, tmp_path):
    """A rank that plans under another profile would run other MPI calls: every
    rank raises MismatchError instead (no rank waits in a collective)."""
    from helpers import need_ranks
    need_ranks(comm, 2)
    if comm.rank == 0:
        path = tmp_path / "other.json"
        path.write_text(json.dumps({"alpha": 1.0, "beta": {"exchange": {"1": 1e9}},
                                    "pack_rate": 1e9, "datatype_rate": 1e9}))
        monkeypatch.setenv(profiles.ENV, str(path))
    else:
        monkeypatch.delenv(profiles.ENV, raising=False)
    try:
        mr.Transfer((64, 64), "float32", {"x": comm.size}, "[{x},{}]", "[{},{x}]")
    except mr.MismatchError as exc:
        got = str(exc)
    else:
        got = None
    all_ok(comm, got is not None and "profile" in got, f"every rank raises, this one: {got}")
    monkeypatch.delenv(profiles.ENV, raising=False)
    t = mr.Transfer((64, 64), "float32", {"x": comm.size}, "[{x},{}]", "[{},{x}]")
    t.free()                                    # agreed again: usable afterwards


def test_calibrate_on_two_nodes_measures_both_link_classes(comm):
    """With two nodes (made up here: ranks by parity; the cluster stage has
    real ones) the profile has rates inside nodes on groups that divide the
    ranks per node, and across nodes on groups of one rank per node; the
    planner reads both."""
    from helpers import need_ranks

    from mpiredist.runtime.calibrate import measure
    need_ranks(comm, 4)
    if comm.size % 2:
        pytest.skip("two nodes of equal size need an even number of ranks")
    nodes = mr.Topology([r % 2 for r in range(comm.size)])
    doc = measure(comm, 16 << 10, 2, topology=nodes)
    within = {str(g) for g in _groups(comm.size // 2)}
    ok = (set(doc["beta"]) == set(profiles.OPS) == set(doc["beta_across"])
          and all(set(v) == within for v in doc["beta"].values())
          and all(set(v) >= {"2"} for v in doc["beta_across"].values())
          and all(str(comm.size) in v for op, v in doc["beta_across"].items() if op != "permute")
          and all(b > 0 for v in doc["beta_across"].values() for b in v.values())
          and (doc["nodes"], doc["ranks_per_node"]) == (2, comm.size // 2))
    all_ok(comm, ok, f"two-level profile: {doc}")
    prof = profiles.Profile.from_dict(doc)
    all_ok(comm, prof.beta_across and prof.beta_for("all_gather", 2, across=True)
           == doc["beta_across"]["all_gather"]["2"], f"{prof}")
    all_ok(comm, comm.allgather(prof.key) == [prof.key] * comm.size,
           "every rank measured the same profile")
