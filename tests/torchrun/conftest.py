"""The torchrun suite: mpiredist over torch.distributed, no MPI.

    timeout 600 torchrun --nproc-per-node N -m pytest -q -p no:cacheprovider tests/torchrun

Every worker runs every test, as the MPI suite's ranks do; the default
process group (gloo, CPU tensors) is made once per worker (tests/conftest.py), and the
job's group is :class:`~mpiredist.runtime.torchdist.TorchGroup` (what
``comm=None`` means under torchrun).  Outside torchrun every test here is
skipped.  CI runs this suite in a venv without mpi4py
(``scripts/test.sh``, stage ``torchrun``), at 2, 3, 4 and 8 workers.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "mpi")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

UNDER_TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ

try:
    from hypothesis import settings
except ImportError:
    settings = None
else:
    # the same examples on every worker: derandomized, no example database
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "mpi"))


def pytest_collection_modifyitems(config, items):
    # a conftest's hook sees every item of the session: only this folder's
    if UNDER_TORCHRUN:
        return
    skip = pytest.mark.skip(reason="run under torchrun (see tests/torchrun/conftest.py)")
    for item in items:
        if os.path.dirname(str(item.path)) == HERE:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def comm():
    """The job as the few communicator methods the helpers use."""
    from helpers import job_comm
    return job_comm()
