#!/usr/bin/env bash
# The package as users get it: build the sdist and the wheel, install the
# wheel into a fresh venv (not editable, run from outside the checkout), and
# run it there.
#
#   bash scripts/wheel_ci.sh
#
# 1. python -m build --outdir DIST . : the sdist, then the wheel built from
#    the unpacked sdist (build's default), so the sdist holds what a build needs
# 2. what they hold: the sdist has pyproject.toml, setup.py, README.md,
#    LICENSE and the package with its data (mpiredist/bench/data/*.json); the
#    wheel has the package, its data and the license, no tests or docs
# 3. a fresh venv: pip install "WHEEL[mpich]", then, from another folder,
#    import mpiredist (from the venv, not the checkout), python -m mpiredist
#    plan ..., the bench's cases from the package data, and a 2-rank run under
#    the venv's mpiexec (PyPI MPICH), bounded by timeout
#
# Knobs: PYTHON (default python3; it needs the build package, installed when
# missing), MPIREDIST_WHEEL_KEEP=1 (keep the folder of the builds and venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

PY="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/mpiredist-wheel.XXXXXX")"
cleanup() { [ "${MPIREDIST_WHEEL_KEEP:-0}" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
T_ALL="$(now)"

t="$(now)"
"$PY" -m build --version >/dev/null 2>&1 || "$PY" -m pip install -q build
"$PY" -m build --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1 || {
    tail -n 40 "$WORK/build.log"; exit 1; }
SDIST="$(ls "$WORK"/dist/mpiredist-*.tar.gz)"
WHEEL="$(ls "$WORK"/dist/mpiredist-*.whl)"
log "wheel: built $(basename "$SDIST"), then from it $(basename "$WHEEL"), in $(since "$t")s"

"$PY" - "$SDIST" "$WHEEL" <<'PYEOF'
import sys, tarfile, zipfile
sdist, wheel = sys.argv[1:]
with tarfile.open(sdist) as t:
    s_names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
w_names = set(zipfile.ZipFile(wheel).namelist())
data = {"mpiredist/bench/data/cases.json", "mpiredist/bench/data/xla_plans.json",
        "mpiredist/bench/data/cross_cases.json"}
need_s = {"pyproject.toml", "setup.py", "README.md", "LICENSE", "mpiredist/__init__.py",
          "mpiredist/draw.py"} | data
problems = [f"sdist lacks {n}" for n in sorted(need_s - s_names)]
problems += [f"wheel lacks {n}" for n in sorted((data | {"mpiredist/__init__.py"}) - w_names)]
if not any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
           for n in w_names):
    problems.append("wheel lacks the LICENSE")
if any(n.startswith(("tests/", "docs/")) for n in w_names):
    problems.append("wheel holds tests/ or docs/")
py = sum(n.endswith(".py") for n in w_names)
print(f"sdist: {len(s_names)} files; wheel: {len(w_names)} files ({py} modules, "
      f"{len(data & w_names)} data files)")
for p in problems:
    print("ERROR:", p)
sys.exit(1 if problems else 0)
PYEOF

t="$(now)"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q "$WHEEL[mpich]"
log "wheel: installed $(basename "$WHEEL")[mpich] into a fresh venv in $(since "$t")s"

mkdir -p "$WORK/elsewhere"
cd "$WORK/elsewhere"                 # away from the checkout: only the venv's package
VPY="$WORK/venv/bin/python"
env -u PYTHONPATH "$VPY" -c '
import sys, importlib.metadata as md, mpiredist
assert "site-packages" in mpiredist.__file__, mpiredist.__file__
assert md.version("mpiredist") == mpiredist.__version__
meta = md.metadata("mpiredist")
lic, req = meta.get("License-Expression"), md.requires("mpiredist")[0]
print(f"import mpiredist {mpiredist.__version__} from {mpiredist.__file__}; "
      f"license {lic}; requires {req}")
from mpiredist.bench.cases import load_cases
print(f"bench data: {len(load_cases())} cases")
'
env -u PYTHONPATH "$VPY" -m mpiredist plan --mesh x=2,y=2 --shape 64,64 \
    --src "[{x,y},{}]" --dst "[{},{x,y}]"
env -u PYTHONPATH timeout 120 "$WORK/venv/bin/mpiexec" -n 2 "$VPY" -m mpi4py -c '
import numpy as np
from mpi4py import MPI
import mpiredist as mr
g = np.arange(10 * 6, dtype=np.float64).reshape(10, 6)
a = mr.DistArray.from_global(g, mr.Mesh("x=2"), "[{x}, {}]")
b = a.redistribute("[{}, {x}]")
assert np.array_equal(b.gather(), g) and b.local.shape == (10, 3)
if MPI.COMM_WORLD.rank == 0:
    print(f"2 ranks: {a.local.shape} -> {b.local.shape}, gathered equal: True")
'
log "wheel: all checks passed in $(since "$T_ALL")s"
