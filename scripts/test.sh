#!/usr/bin/env bash
# The one test command: serial (MPI-free) suite, the import layers
# (lint-imports), then the MPI suite under mpiexec for each rank count.
#
#   bash scripts/test.sh
#   MPIREDIST_TEST_RANKS="2 4" bash scripts/test.sh     # fewer rank counts
#   MPIREDIST_SKIP_INSTALL=1 bash scripts/test.sh       # reuse .venv as is
#
# Knobs: MPIREDIST_TEST_RANKS (default "1 2 3 4 8"), MPIREDIST_MPI_TIMEOUT
# (seconds per rank count, default 300), MPIREDIST_HANG_DUMP (seconds before
# a running test dumps its tracebacks, default 120), MPIREDIST_PIP_EXTRAS (default
# "test,mpich"; "test" on a cluster whose mpi4py is built against the
# system MPI), plus those of scripts/common.sh.  Extra arguments are passed
# to every pytest call (e.g. -x, -k expr).
#
# Only rank 0 prints; ranks > 0 write to a per-run log directory whose tails
# are shown when those ranks fail.  Exit status: 0 when every stage passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/common.sh
source scripts/common.sh

RANKS="${MPIREDIST_TEST_RANKS:-1 2 3 4 8}"
MPI_TIMEOUT="${MPIREDIST_MPI_TIMEOUT:-300}"
# A test still running after this many seconds gets every rank's traceback
# dumped (pytest's faulthandler_timeout): shows where a hang sits.
HANG_DUMP="${MPIREDIST_HANG_DUMP:-120}"
SUMMARY=()
FAILED=0
T_ALL="$(now)"

header() { printf '\n========== %s ==========\n' "$*"; }

record() {  # stage, status, start time
    local line
    line="$(printf '%-22s %-22s %6ss' "$1" "$2" "$(since "$3")")"
    SUMMARY+=("$line")
    echo "---------- $line"
}

header "set-up: venv + pip install -e .[${MPIREDIST_PIP_EXTRAS:-test,mpich}]"
t="$(now)"
setup_venv "${MPIREDIST_PIP_EXTRAS:-test,mpich}"
record "set-up" "ok" "$t"

header "serial tests (MPI-free): pytest tests -m 'not mpi'"
t="$(now)"
rc=0
python -m pytest -q tests -m "not mpi" --ignore=tests/mpi "$@" || rc=$?
if [ "$rc" = 0 ]; then
    record "serial" "ok" "$t"
else
    record "serial" "FAILED (pytest rc=$rc)" "$t"
    FAILED=1
fi

header "import layers: lint-imports (contracts in pyproject.toml)"
t="$(now)"
rc=0
if command -v lint-imports >/dev/null; then
    lint-imports --no-cache || rc=$?
else
    log "error: no lint-imports on PATH; install the test extra (pip install -e '.[test]')"
    rc=127
fi
if [ "$rc" = 0 ]; then
    record "import layers" "ok" "$t"
else
    record "import layers" "FAILED (lint-imports rc=$rc)" "$t"
    FAILED=1
fi

LOGROOT="$(mktemp -d "${TMPDIR:-/tmp}/mpiredist-test.XXXXXX")"
for n in $RANKS; do
    extra_env="$(mpi_oversubscription_env "$n")"
    header "MPI tests, $n rank(s): $MPIEXEC -n $n pytest --with-mpi tests/mpi ${extra_env:+[$extra_env]}"
    logdir="$LOGROOT/np$n"
    mkdir -p "$logdir"
    t="$(now)"
    rc=0
    # Each rank records its own pytest exit status: hydra reports only the
    # largest one, so "no tests collected" (5) could hide a failure (1).
    # shellcheck disable=SC2016,SC2086
    env $extra_env timeout "$MPI_TIMEOUT" "$MPIEXEC" -n "$n" bash -c '
        r="${PMI_RANK:-${SLURM_PROCID:-0}}"; d="$1"; shift
        if [ "$r" = 0 ]; then "$@"; else "$@" >"$d/rank-$r.log" 2>&1; fi
        s=$?; echo "$s" >"$d/rank-$r.rc"; exit "$s"' \
        _ "$logdir" python -m pytest -q -p no:cacheprovider --with-mpi \
        -o faulthandler_timeout="$HANG_DUMP" tests/mpi "$@" \
        || rc=$?

    status=""
    codes="$( (cat "$logdir"/rank-*.rc 2>/dev/null || true) | sort -u | tr '\n' ' ')"
    nfiles="$(find "$logdir" -name 'rank-*.rc' | wc -l)"
    if [ "$rc" = 124 ]; then
        status="FAILED (timeout ${MPI_TIMEOUT}s)"
    elif [ "$nfiles" != "$n" ]; then
        status="FAILED (mpiexec rc=$rc, $nfiles/$n ranks finished)"
    elif [ "$codes" = "0 " ]; then
        status="ok"
    elif [ "$codes" = "5 " ]; then
        status="ok (no tests collected)"
        echo "WARNING: pytest collected no MPI tests in tests/mpi at $n rank(s)" >&2
    else
        status="FAILED (rank rcs: ${codes% })"
    fi
    if [ "${status#FAILED}" != "$status" ]; then
        FAILED=1
        for f in "$logdir"/rank-*.log; do
            [ -e "$f" ] || continue
            r="${f##*/rank-}"; r="${r%.log}"
            if [ "$(cat "$logdir/rank-$r.rc" 2>/dev/null || echo '?')" != 0 ]; then
                echo "---- tail of rank $r output ($f)"
                tail -n 40 "$f"
            fi
        done
    fi
    record "mpi np=$n" "$status" "$t"
done

header "summary"
printf '%s\n' "${SUMMARY[@]}"
if [ "$FAILED" = 0 ]; then
    echo "ALL STAGES PASSED in $(since "$T_ALL")s (rank logs: $LOGROOT)"
else
    echo "SOME STAGES FAILED in $(since "$T_ALL")s (rank logs: $LOGROOT)"
fi
exit "$FAILED"
