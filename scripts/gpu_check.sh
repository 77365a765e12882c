#!/usr/bin/env bash
# The device check (issue "The arrays users hold"): CuPy arrays and torch CUDA
# tensors through mpiredist at 2 and 4 ranks on one GPU, staged and (where the
# MPI is CUDA-aware) direct, against the oracle, with device memory and times.
#
#   bash scripts/gpu_check.sh WHEELS_DIR      # a machine with a GPU, CuPy, torch, mpi4py
#   bash scripts/gpu_check.sh --fake          # a CPU: the fake CuPy of tests/fakecupy.py
#
# WHEELS_DIR holds the MPI wheel (e.g. `pip download mpich -d wheels`) for a
# machine that has mpi4py but no MPI library and no network; it is installed
# with --no-index into the current Python.  Every mpiexec is bounded by
# `timeout`; the whole check takes well under 5 minutes.  MPIREDIST_GPU_RANKS
# (default "2 4") and MPIREDIST_GPU_SCALE (default 64) change what runs.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source scripts/common.sh     # mpi_oversubscription_env: yield when ranks outnumber cores
PY=${PYTHON:-python3}
FAKE=()
if [[ "${1:-}" == "--fake" ]]; then
    FAKE=(--fake)
elif [[ -n "${1:-}" ]]; then
    "$PY" -m pip install -q --no-index --find-links "$1" mpich || exit 2
fi
MPIEXEC=$(dirname "$(command -v "$PY")")/mpiexec
[[ -x "$MPIEXEC" ]] || MPIEXEC=$(command -v mpiexec) || { echo "no mpiexec" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
for n in ${MPIREDIST_GPU_RANKS:-2 4}; do
    # shellcheck disable=SC2046  # VAR=value words
    env $(mpi_oversubscription_env "$n") timeout 120 "$MPIEXEC" -n "$n" "$PY" \
        scripts/gpu_check.py "${FAKE[@]}" --scale "${MPIREDIST_GPU_SCALE:-64}" || rc=1
done
exit $rc
