#!/usr/bin/env bash
# Run the benchmark (quick mode) on this machine with the PyPI MPICH.
#
#   bash scripts/bench.sh                       # 8 ranks
#   MPIREDIST_RANKS=4 bash scripts/bench.sh --json bench-local.json
#
# Arguments are passed to `python -m mpiredist.bench --quick`.  Knobs:
# MPIREDIST_RANKS (default 8), MPIREDIST_BENCH_TIMEOUT (seconds, default
# 900), MPIREDIST_PIP_EXTRAS (default "bench,mpich"), and those of
# scripts/common.sh.  On a cluster use slurm/bench.sbatch instead.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

NRANKS="${MPIREDIST_RANKS:-8}"
t="$(now)"
setup_venv "${MPIREDIST_PIP_EXTRAS:-bench,mpich}"
log "set-up took $(since "$t")s"

extra_env="$(mpi_oversubscription_env "$NRANKS")"
log "running $NRANKS ranks ${extra_env:+with $extra_env}"
t="$(now)"
rc=0
# shellcheck disable=SC2086
env $extra_env timeout "${MPIREDIST_BENCH_TIMEOUT:-900}" \
    "$MPIEXEC" -n "$NRANKS" python -m mpiredist.bench --quick "$@" || rc=$?
log "benchmark finished with status $rc after $(since "$t")s"
exit "$rc"
