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
