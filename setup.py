"""Packaging for mpiredist.

Typical installs::

    pip install -e ".[test,mpich]"    # laptop / CI: PyPI MPICH + mpi4py wheels
    pip install -e ".[test]"          # cluster: mpi4py built against system MPI
                                      # (MPICC=mpicc pip install --no-binary mpi4py mpi4py)
"""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent


def read_version():
    """Return ``__version__`` from mpiredist/__init__.py without importing it."""
    text = (HERE / "mpiredist" / "__init__.py").read_text(encoding="utf-8")
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.M)
    if match is None:
        raise RuntimeError("mpiredist/__init__.py does not define __version__")
    return match.group(1)


MPI4PY = "mpi4py>=4"

setup(
    name="mpiredist",
    version=read_version(),
    description="Memory-efficient redistribution of distributed arrays over MPI",
    python_requires=">=3.9",
    packages=find_packages(exclude=["tests", "tests.*"]),
    # Benchmark cases and recorded XLA plans, read via importlib.resources.
    package_data={"mpiredist.bench": ["data/*.json"]},
    install_requires=["numpy"],
    extras_require={
        "mpi": [MPI4PY],
        "mpich": [MPI4PY, "mpich"],  # PyPI MPICH, for laptops and CI
        "test": ["pytest", "pytest-mpi", "hypothesis", MPI4PY, "h5py", "matplotlib"],
        "hdf5": ["h5py"],
        "cupy": ["cupy-cuda12x"],
        "bench": ["matplotlib", MPI4PY],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: System :: Distributed Computing",
    ],
)
