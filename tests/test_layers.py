"""The package's layers (docs/architecture.md), checked by import-linter.

The contracts live in pyproject.toml (``[tool.importlinter]``): bench and CLI
on top, then arrays, runtime, planning, core; the CLI off the bench's
submodules; no mpi4py in core or planning, nor in the package root and the
CLI modules themselves; no import cycle inside a layer.
import-linter is in the ``test`` extra; without it these tests are skipped.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed "
                    "(pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ("Layers: bench and cli, checkpoint, arrays, runtime, planning, core",
             "The CLI imports nothing of the bench",
             "core and planning import no mpi4py",
             "No import cycles between the modules of one layer",
             "import mpiredist and python -m mpiredist import no mpi4py")
LINT = ("import sys\nfrom importlinter.cli import lint_imports_command\n"
        "sys.exit(lint_imports_command())")


def _lint_imports(root):
    """Run lint-imports on the package under ``root``; the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], capture_output=True,
                          text=True, cwd=root, env=env, timeout=300)


def _verdicts(stdout):
    """``{contract name prefix: "KEPT" or "BROKEN"}`` from lint-imports' report."""
    found = {}
    for line in stdout.splitlines():
        for name in CONTRACTS:
            if line.startswith(name) and line.rstrip().endswith(("KEPT", "BROKEN")):
                found[name] = line.rsplit(None, 1)[-1]
    return found


def test_every_contract_is_kept():
    done = _lint_imports(ROOT)
    assert _verdicts(done.stdout) == dict.fromkeys(CONTRACTS, "KEPT"), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr


def _plant(package, module, line):
    """Append an import ``line`` to ``module`` (a path under the copied package)."""
    path = package / module
    path.write_text(path.read_text(encoding="utf-8") + "\n" + line + "\n", encoding="utf-8")


def test_the_contracts_catch_violations(tmp_path):
    """A copy of the package with one violation per contract breaks each of them."""
    package = tmp_path / "mpiredist"
    shutil.copytree(ROOT / "mpiredist", package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    _plant(package, "planning/plans.py", "from ..runtime import groups  # noqa")
    _plant(package, "cli.py", "from .bench import report  # noqa")
    _plant(package, "cli.py", "from .runtime import mpi  # noqa")
    _plant(package, "core/errors.py", "import mpi4py  # noqa")
    _plant(package, "core/layout.py", "from . import mesh  # noqa")
    _plant(package, "core/mesh.py", "from . import layout  # noqa")
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    assert _verdicts(done.stdout) == dict.fromkeys(CONTRACTS, "BROKEN"), done.stdout
    for culprit in ("mpiredist.planning.plans -> mpiredist.runtime.groups",
                    "mpiredist.cli -> mpiredist.bench.report",
                    "mpiredist.core.errors -> mpi4py",
                    "mpiredist.cli is not allowed to import mpi4py"):
        assert culprit in done.stdout
