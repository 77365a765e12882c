"""Packaging for mpiredist.

Typical installs::

    pip install -e ".[test,mpich]"    # laptop / CI: PyPI MPICH + mpi4py wheels
    pip install -e ".[test]"          # cluster: mpi4py built against system MPI
                                      # (MPICC=mpicc pip install --no-binary mpi4py mpi4py)

Lower bounds, each checked by running the tests against it: Python 3.10
(dataclass slots; the serial suite and the MPI suite at 3 ranks pass),
numpy 1.21.2 (the oldest with Python 3.10 wheels; the same suites pass),
tabulate 0.9 and tqdm 4.62 (bench tables and progress), import-linter
2.12 (the contracts in pyproject.toml).  numpy 2.5 makes
``ndarray.resize`` a new allocation and copy; there a donated block is
never resized (mpiredist.runtime.inputs.resize_in_place), only reused
when it is large enough.
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
# The bench's tables and progress bar; without them it prints plain text.
DISPLAY = ["tabulate>=0.9", "tqdm>=4.62"]

setup(
    name="mpiredist",
    version=read_version(),
    description="Memory-efficient redistribution of distributed arrays over MPI",
    python_requires=">=3.10",
    packages=find_packages(exclude=["tests", "tests.*"]),
    # Benchmark cases and recorded XLA plans, read via importlib.resources.
    package_data={"mpiredist.bench": ["data/*.json"]},
    install_requires=["numpy>=1.21.2"],
    extras_require={
        "mpi": [MPI4PY],
        "mpich": [MPI4PY, "mpich"],  # PyPI MPICH, for laptops and CI
        "test": ["pytest", "pytest-mpi", "hypothesis", MPI4PY, "h5py", "matplotlib",
                 "import-linter>=2.12", "ml_dtypes", *DISPLAY],
        "hdf5": ["h5py"],
        "cupy": ["cupy-cuda12x"],
        "torch": ["torch", "ml_dtypes"],    # CPU build: pip install torch==2.13.0+cpu
        "jax": ["jax", "ml_dtypes"],
        "heat": ["heat", "scipy"],          # on a CPU torch: pip install --no-deps heat
        "bench": ["matplotlib", MPI4PY, *DISPLAY],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: System :: Distributed Computing",
    ],
)
