"""The peers bench (python -m benchmarks.bench_peers) at a tiny size: its results
are checked against the peers' own inside the bench, which returns 1 on any
difference.  Skips without torch.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_bench_peers.py
"""

import pytest
from mpi4py import MPI

from helpers import all_ok

pytest.importorskip("torch")


def test_bench_peers_tiny(capsys):
    from benchmarks import bench_peers as peers
    rc = peers.main(["--scale", "256", "--repeats", "1", "--cases", "c01,c04"])
    out = capsys.readouterr().out
    all_ok(MPI.COMM_WORLD, rc == 0, f"bench.peers returned {rc}")
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "peers:" in out and "DIFFERS" not in out
