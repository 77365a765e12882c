"""The many-arrays bench (python -m benchmarks.bench_state_dict) at a tiny size: every
strategy's result is checked against the source arrays inside the bench, which
returns 1 on any wrong result.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_bench_many.py
"""

from mpi4py import MPI

from helpers import all_ok
from benchmarks import bench_state_dict as many


def test_bench_many_tiny(capsys):
    rc = many.main(["--layers", "2", "--hidden", "16", "--repeats", "2",
                    "--bucket", "0.01"])
    out = capsys.readouterr().out
    all_ok(MPI.COMM_WORLD, rc == 0, f"bench.many returned {rc}")
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "reshard" in out and "group" in out and "FAIL" not in out
        assert "reshard  patterns" in out and "the floor by pattern" in out
        assert len(many.state_dict(24, 256)) == 314


def test_bench_many_into_out_blocks(capsys):
    """--out: every strategy but bcast fills the warm-up's blocks, checked after
    the timed runs; --workspace sets the group's W."""
    rc = many.main(["--layers", "2", "--hidden", "16", "--repeats", "1",
                    "--out", "--workspace", "0.5"])
    out = capsys.readouterr().out
    all_ok(MPI.COMM_WORLD, rc == 0, f"bench.many --out returned {rc}")
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "into out= blocks" in out and "within W 0.50 MiB" in out and "FAIL" not in out
        assert "reshard  loop" in out and "bcast" not in out

