"""The many-arrays bench (python -m mpiredist.bench.many) at a tiny size: every
strategy's result is checked against the source arrays inside the bench, which
returns 1 on any wrong result.

    timeout 300 mpiexec -n N python -m pytest -q --with-mpi tests/mpi/test_bench_many.py
"""

from mpi4py import MPI

from helpers import all_ok
from mpiredist.bench import many


def test_bench_many_tiny(capsys):
    rc = many.main(["--layers", "2", "--hidden", "16", "--repeats", "1", "--bucket", "0.01"])
    out = capsys.readouterr().out
    all_ok(MPI.COMM_WORLD, rc == 0, f"bench.many returned {rc}")
    if MPI.COMM_WORLD.Get_rank() == 0:
        assert "reshard" in out and "group" in out and "FAIL" not in out
        assert len(many.state_dict(24, 256)) == 314
