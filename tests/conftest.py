"""Shared pytest set-up for the whole suite.

Makes ``tests/`` importable (``import oracle``) whatever pytest's import
mode, and the repository root (``import benchmarks``: the research
harnesses live beside the package, not in it), and registers the Hypothesis
profiles:

- ``ci`` (the default): no per-example deadline (CI machines are slow and
  shared), print the reproduction blob of a failure, do not fail on slow
  data generation.
- ``mpi``: ``ci`` plus derandomized and without an example database, so
  every rank of an MPI run draws the same examples in the same order;
  loaded by ``tests/mpi/conftest.py``.

``HYPOTHESIS_PROFILE=<name>`` in the environment overrides the choice.

Under torchrun (``TORCHELASTIC_RUN_ID`` set) every worker makes
torch.distributed's default group (gloo) before the tests are collected,
so that modules that read the job at import (``tests/mpi/helpers.job_comm``)
find it; see ``tests/torchrun/conftest.py``.
"""

import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT_DIR = os.path.dirname(TESTS_DIR)
for _path in (TESTS_DIR, ROOT_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # hypothesis is in the "test" extra; tests needing it fail clearly
    settings = None

if settings is not None:
    settings.register_profile(
        "ci",
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "mpi",
        parent=settings.get_profile("ci"),
        derandomize=True,
        database=None,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    if "TORCHELASTIC_RUN_ID" in os.environ:
        import datetime

        import torch.distributed as dist
        if not dist.is_initialized():
            # a bound on every collective: a test that leaves a peer behind
            # fails after it instead of holding the job for gloo's 30 minutes
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
