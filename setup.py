"""Packaging shim: the metadata lives in pyproject.toml ([project]).

Kept for tools that still call ``python setup.py``; ``pip install .`` and
``python -m build`` read pyproject.toml.  Typical installs::

    pip install mpiredist                 # numpy only: plan, model, the CLI
    pip install "mpiredist[mpich]"        # laptop / CI: PyPI MPICH + mpi4py wheels
    pip install "mpiredist[mpi]"          # cluster: mpi4py built against the system MPI
                                          # (MPICC=mpicc pip install --no-binary mpi4py mpi4py)
    pip install -e ".[test,mpich]"        # a checkout, with the test suite's needs
"""

from setuptools import setup

setup()
