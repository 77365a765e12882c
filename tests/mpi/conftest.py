"""Fixtures for the MPI suite (run under mpiexec with ``--with-mpi``).

Tests here import their helpers as ``from helpers import all_ok, need_ranks``
and the serial reference as ``import oracle``.  Every rank runs every test;
results must be agreed across ranks (see ``helpers.all_ok``) so that a
failure on one rank fails all of them instead of leaving the others
blocked in a collective.
"""

import os
import sys

import pytest

MPI_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(MPI_TESTS_DIR), MPI_TESTS_DIR):  # tests/, tests/mpi/
    if _path not in sys.path:
        sys.path.insert(0, _path)

try:
    from hypothesis import settings
except ImportError:
    settings = None
else:
    # Same examples on every rank: derandomized, no example database.
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "mpi"))


@pytest.fixture(scope="session")
def comm():
    """Return ``MPI.COMM_WORLD``."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def pytest_collection_modifyitems(config, items):
    """Skip tests marked ``large`` unless ``MPIREDIST_LARGE=1`` asks for them.

    They need several GiB per rank, so CI runs them alone, once per MPI
    library (scripts/test.sh); the same decision on every rank.
    """
    if os.environ.get("MPIREDIST_LARGE") == "1":
        return
    skip = pytest.mark.skip(reason="needs several GiB per rank: set MPIREDIST_LARGE=1 "
                                   "and run it alone (-m large)")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)
