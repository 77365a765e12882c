#!/usr/bin/env bash
# CI stage: a real, single-node Slurm from Debian's packages (slurmctld,
# slurmd, slurm-client, munge) runs the job templates slurm/tests.sbatch and
# slurm/bench.sbatch as they are in the repository, with `sbatch --wait`.
#
#   bash scripts/slurm_ci.sh            # as root, on Debian/Ubuntu
#
# After the jobs, tests/test_failure.py under srun --kill-on-bad-exit: a rank
# that fails or is killed mid-run ends the whole job.
#
# Steps: install the packages if missing; write slurm.conf, logs, state and
# the munge socket into a temporary directory; start munged (as the munge
# user), slurmctld and slurmd in the background, recording their PIDs; wait
# for the node to be idle; submit both templates from the repository root
# with only the overrides a cluster user would pass (sbatch options and the
# environment variables the templates document); check their outputs; stop
# the daemons by PID and remove the temporary directory (trap on exit).
# Every wait is bounded.  Exit status 0 only when every check passed.
#
# Knobs (all optional):
#   MPIREDIST_VENV              venv the jobs use (default .venv, as made by
#                               scripts/test.sh); created with the PyPI MPICH
#                               if missing, so nothing is built from source
#   MPIREDIST_SLURM_NTASKS      tasks of each job (default 8; the node has 8 CPUs)
#   MPIREDIST_SLURM_TEST_RANKS  rank counts of the tests job (default "2 8")
#   MPIREDIST_SLURM_SERIAL_TESTS, MPIREDIST_SLURM_MPI_TESTS
#                               test paths of the tests job (default a subset)
#   MPIREDIST_SLURM_BENCH_CASES cases of the bench job (default c01,c03,c11)
#   MPIREDIST_SLURM_BENCH_ARGS  other bench arguments (default "--quick --no-progress")
#   MPIREDIST_SLURM_TESTS_TIMEOUT / MPIREDIST_SLURM_BENCH_TIMEOUT
#                               seconds each `sbatch --wait` may take (900 / 600)
#   MPIREDIST_SLURM_KEEP=1      keep the temporary directory (logs, outputs)
#   MPIREDIST_SRUN_MPI, MPIREDIST_MPI_TIMEOUT  passed to the jobs (default
#                               --mpi=pmi2, 300 s per srun)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"

NTASKS="${MPIREDIST_SLURM_NTASKS:-8}"
TEST_RANKS="${MPIREDIST_SLURM_TEST_RANKS:-2 8}"
BENCH_CASES="${MPIREDIST_SLURM_BENCH_CASES:-c01,c03,c11}"
BENCH_ARGS="${MPIREDIST_SLURM_BENCH_ARGS:---quick --no-progress}"
TESTS_TIMEOUT="${MPIREDIST_SLURM_TESTS_TIMEOUT:-900}"
BENCH_TIMEOUT="${MPIREDIST_SLURM_BENCH_TIMEOUT:-600}"
VENV="${MPIREDIST_VENV:-$REPO/.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO/$VENV" ;; esac
# PIDs of the daemons this script started, so that a run killed before its
# trap ran can be cleaned up by the next run (by PID, name checked).
PIDFILE="${TMPDIR:-/tmp}/mpiredist-slurm-ci.pids"

# log, now, since and the yield settings (mpi_oversubscription_env)
# shellcheck source=scripts/common.sh
source scripts/common.sh
die() { log "FAILED: $*"; exit 1; }

T_ALL="$(now)"
PHASES=()
PHASE=""
T_PHASE=""
phase() {  # end the current phase (if any) and start phase $1 (if given)
    if [ -n "$PHASE" ]; then
        PHASES+=("$(printf '%-28s %7ss' "$PHASE" "$(since "$T_PHASE")")")
        log "phase '$PHASE' took $(since "$T_PHASE")s"
    fi
    PHASE="${1:-}"
    T_PHASE="$(now)"
    [ -z "$PHASE" ] || printf '\n========== %s ==========\n' "$PHASE" >&2
}

# ---------------------------------------------------------------- processes
# State of process $1: empty when gone; zombies (Z) count as stopped.
alive() {
    local st
    st="$(ps -o stat= -p "$1" 2>/dev/null || true)"
    [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}

# Stop process $2 (named $1): TERM, up to 10 s, then KILL, up to 5 s.
stop_pid() {
    local name="$1" pid="$2" i
    if alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do alive "$pid" || break; sleep 0.1; done
        if alive "$pid"; then
            log "$name ($pid) ignored SIGTERM for 10 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
        fi
    fi
    wait "$pid" 2>/dev/null || true     # reap it if it is our child
    if alive "$pid"; then log "error: $name ($pid) still running"; return 1; fi
    log "stopped $name ($pid)"
}

# Daemons left by an earlier run that was killed before its trap ran: cancel
# its jobs, stop its daemons (by the PIDs it recorded, if their names still
# match) and remove its temporary directory.
stop_leftovers() {
    [ -f "$PIDFILE" ] || return 0
    local name pid comm dir="" i jobs
    local -a found=()
    while read -r name pid; do
        if [ "$name" = dir ]; then dir="$pid"; continue; fi
        comm="$(ps -o comm= -p "$pid" 2>/dev/null || true)"
        if [ "$comm" = "$name" ] && alive "$pid"; then found+=("$name $pid"); fi
    done <"$PIDFILE"
    if [ "${#found[@]}" -gt 0 ]; then
        log "an earlier run left ${found[*]}: stopping them"
        if [ -n "$dir" ] && [ -f "$dir/slurm.conf" ] && printf '%s\n' "${found[@]}" | grep -q '^slurmctld '; then
            jobs="$(SLURM_CONF="$dir/slurm.conf" timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
            # shellcheck disable=SC2086
            [ -z "${jobs// /}" ] || SLURM_CONF="$dir/slurm.conf" timeout 10 scancel $jobs || true
            for ((i = 0; i < 300; i++)); do
                [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h -o %i 2>/dev/null)" ] && break
                sleep 0.1
            done
        fi
        for ((i = ${#found[@]} - 1; i >= 0; i--)); do
            read -r name pid <<<"${found[$i]}"
            stop_pid "$name" "$pid" || true
        done
    fi
    case "$dir" in "${TMPDIR:-/tmp}"/mpiredist-slurm.*) rm -rf "$dir" ;; esac
    rm -f "$PIDFILE"
}

DAEMONS=()          # "name pid", in start order
start_daemon() {    # name, log file, command...
    local name="$1" out="$2"
    shift 2
    "$@" >"$out" 2>&1 &
    DAEMONS+=("$name $!")
    echo "$name $!" >>"$PIDFILE"
    log "started $name (pid $!): $*"
}

T=""
SBATCH_PID=""
# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
    local rc=$? i name pid jobs
    set +e
    trap - EXIT INT TERM
    [ -z "$PHASE" ] || [ "$rc" = 0 ] || log "failed in phase '$PHASE'"
    phase "stop daemons"
    if [ -n "${SBATCH_PID:-}" ] && alive "$SBATCH_PID"; then
        stop_pid "sbatch --wait" "$SBATCH_PID"
    fi
    # Jobs still queued or running (interrupted, timed out): cancel every
    # job of this private cluster and wait for them to end, so that no job
    # process outlives slurmd.
    if [ -n "${SLURMCTLD_PID:-}" ] && alive "$SLURMCTLD_PID"; then
        jobs="$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
        if [ -n "${jobs// /}" ]; then
            log "cancelling jobs still in the queue: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null
            for ((i = 0; i < 300; i++)); do
                [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
                sleep 0.1
            done
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] || log "error: jobs still queued after 30 s"
        fi
    fi
    # A finished job's slurmstepd lingers a moment (its socket is in the
    # spool directory); let it go before slurmd does.
    if [ -n "$T" ] && compgen -G "$T/spool/localhost_*" >/dev/null; then
        for ((i = 0; i < 150; i++)); do
            compgen -G "$T/spool/localhost_*" >/dev/null || break
            sleep 0.1
        done
        compgen -G "$T/spool/localhost_*" >/dev/null && log "warning: job steps still running after 15 s:" "$T"/spool/localhost_*
    fi
    for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do   # reverse start order
        read -r name pid <<<"${DAEMONS[$i]}"
        stop_pid "$name" "$pid" || rc=1
    done
    rm -f "$PIDFILE"
    if [ "$rc" != 0 ] && [ -n "$T" ]; then
        for f in "$T"/slurmctld.log "$T"/slurmd.log "$T"/munge/munged.log \
                 "$T"/munged.daemon.out "$T"/slurm*.daemon.out; do
            [ -s "$f" ] || continue
            echo "---- tail of $f"
            tail -n 15 "$f"
        done
    fi
    if [ -n "$T" ] && [ -d "$T" ]; then
        if [ "${MPIREDIST_SLURM_KEEP:-0}" = 1 ]; then
            log "kept $T"
        else
            rm -rf "$T"
        fi
    fi
    phase
    printf '\n========== summary ==========\n'
    printf '%s\n' "${PHASES[@]}"
    if [ "$rc" = 0 ]; then
        echo "SLURM CI PASSED in $(since "$T_ALL")s"
    else
        echo "SLURM CI FAILED (status $rc) after $(since "$T_ALL")s"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts slurmd)"

# ------------------------------------------------------------------ install
phase "install packages"
stop_leftovers
need=()
for b in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge \
         ps:procps timeout:coreutils setpriv:util-linux; do
    command -v "${b%%:*}" >/dev/null 2>&1 || need+=("${b#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
    log "apt-get install ${need[*]}"
    # Keep the packages' init scripts from starting daemons whose PIDs we
    # would not own (Docker-style policy-rc.d, only if none is there).
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy=/usr/sbin/policy-rc.d
    fi
    rc=0
    {
        timeout 600 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq \
            --no-install-recommends "${need[@]}" >/dev/null
    } || rc=$?
    [ -z "$policy" ] || rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install ${need[*]} (status $rc)"
else
    log "slurmctld, slurmd, slurm-client and munge already installed"
fi
log "$(slurmctld -V), $(munged -V 2>&1 | head -n 1)"

if ! "$VENV/bin/python" -c 'import mpi4py, pytest, mpiredist' 2>/dev/null; then
    log "no usable venv at $VENV: creating it with the PyPI MPICH"
    MPIREDIST_VENV="$VENV" bash -c 'set -euo pipefail; source scripts/common.sh
        setup_venv "test,bench,mpich"' || die "could not create the venv $VENV"
fi
log "venv: $VENV ($("$VENV/bin/python" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())'))"

# ------------------------------------------------------------------- config
phase "configure"
T="$(mktemp -d "${TMPDIR:-/tmp}/mpiredist-slurm.XXXXXX")"
echo "dir $T" >"$PIDFILE"
chmod 711 "$T"                      # munged (as munge) must reach $T/munge
mkdir -p "$T/state" "$T/spool"
install -d -o munge -g munge -m 711 "$T/munge"  # socket needs o+x
KEY=/etc/munge/munge.key
if [ ! -s "$KEY" ]; then
    log "creating $KEY"
    install -d -o munge -g munge -m 700 /etc/munge
    (umask 077; dd if=/dev/urandom of="$KEY" bs=1024 count=1 status=none)
    chown munge:munge "$KEY"
    chmod 400 "$KEY"
fi
MUNGE_SOCKET="$T/munge/munge.socket"
CPUS="$NTASKS"
export SLURM_CONF="$T/slurm.conf"
cat >"$SLURM_CONF" <<EOF
# Single-node CI cluster written by scripts/slurm_ci.sh
ClusterName=mpiredist-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# $CPUS CPUs whatever the machine has: slurmd accepts the configured count.
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# The PyPI MPICH speaks PMI-2 (not PMIx); the templates pass --mpi=pmi2 too.
MpiDefault=pmi2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Keep finished jobs' records (the cluster lives for one run).  Also keeps
# sbatch --wait polling every 2 s: it stretches its poll to 8 and 32 s
# only while that is under MinJobAge/2.
MinJobAge=0
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$CPUS State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
log "wrote $SLURM_CONF"

# ------------------------------------------------------------------- start
phase "start daemons"
start_daemon munged "$T/munged.daemon.out" \
    setpriv --reuid=munge --regid=munge --init-groups \
    munged -F --socket="$MUNGE_SOCKET" --pid-file="$T/munge/munged.pid" \
    --seed-file="$T/munge/munged.seed" --log-file="$T/munge/munged.log"
MUNGED_PID="${DAEMONS[-1]#* }"
for ((i = 0; i < 100; i++)); do
    munge -n --socket="$MUNGE_SOCKET" 2>/dev/null | unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1 && break
    alive "$MUNGED_PID" || die "munged exited: $(cat "$T/munged.daemon.out" "$T/munge/munged.log" 2>/dev/null)"
    sleep 0.1
done
munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET" >/dev/null || die "munge does not work after 10 s"
log "munge credentials work"

start_daemon slurmctld "$T/slurmctld.daemon.out" slurmctld -D -i -f "$SLURM_CONF"
SLURMCTLD_PID="${DAEMONS[-1]#* }"
start_daemon slurmd "$T/slurmd.daemon.out" slurmd -D -N localhost -f "$SLURM_CONF"
SLURMD_PID="${DAEMONS[-1]#* }"
state=""
for ((i = 0; i < 300; i++)); do
    alive "$SLURMCTLD_PID" || die "slurmctld exited"
    alive "$SLURMD_PID" || die "slurmd exited"
    state="$(sinfo -h -n localhost -o %t 2>/dev/null || true)"
    [ "$state" = idle ] && break
    sleep 0.2
done
[ "$state" = idle ] || die "node not idle after 60 s (state: '${state:-no answer}')"
sinfo

# -------------------------------------------------------------- jobs
# What a user of the templates would set: the venv to use (so nothing is
# built), the srun MPI plugin for the PyPI MPICH, the rank counts, where the
# bench JSON goes.  srun passes the environment on to the ranks.
export MPIREDIST_VENV="$VENV"
export MPIREDIST_SRUN_MPI="${MPIREDIST_SRUN_MPI:---mpi=pmi2}"
export MPIREDIST_TEST_RANKS="$TEST_RANKS"
# The whole suites ran under the same MPI in scripts/test.sh's earlier
# stages; here a subset checks the template, srun and PMI (about 1 minute
# instead of 4: CI stays under 15).  MPIREDIST_SLURM_*_TESTS=tests(/mpi) for all.
export MPIREDIST_SLURM_SERIAL_TESTS="${MPIREDIST_SLURM_SERIAL_TESTS:-tests/test_cli.py tests/test_layout.py}"
export MPIREDIST_SLURM_MPI_TESTS="${MPIREDIST_SLURM_MPI_TESTS:-tests/mpi/test_smoke.py tests/mpi/test_redistribute.py tests/mpi/test_transfer.py tests/mpi/test_cross_mesh.py}"
export MPIREDIST_MPI_TIMEOUT="${MPIREDIST_MPI_TIMEOUT:-300}"   # per srun, as scripts/test.sh
export MPIREDIST_BENCH_JSON="$T/bench.json"
# The resident-set memory test needs these from process start (README: Memory).
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-131072}"
export NUMPY_MADVISE_HUGEPAGE="${NUMPY_MADVISE_HUGEPAGE:-0}"
# More ranks than cores: the MPI must not busy-poll (scripts/common.sh).
for setting in $(mpi_oversubscription_env "$NTASKS"); do
    export "${setting?}"
done
SBATCH_OVERRIDES=(--export=ALL --nodes=1 --ntasks-per-node="$NTASKS")

# submit NAME TIMEOUT TIME_LIMIT TEMPLATE [ARGS...]: sbatch --wait from the
# repository root; sets JOB_RC and JOB_OUT.
submit() {
    local name="$1" limit="$2" tlimit="$3" template="$4"
    shift 4
    JOB_OUT="$T/$name.out"
    log "sbatch --wait ${SBATCH_OVERRIDES[*]} --time=$tlimit --output=$JOB_OUT $template $*"
    JOB_RC=0
    # In the background + wait, so that a signal runs the trap at once.
    timeout "$limit" sbatch --wait --parsable "${SBATCH_OVERRIDES[@]}" --time="$tlimit" \
        --output="$JOB_OUT" "$template" "$@" >"$T/$name.jobid" &
    SBATCH_PID=$!
    echo "timeout $SBATCH_PID" >>"$PIDFILE"    # for a run killed before its trap
    wait "$SBATCH_PID" || JOB_RC=$?
    SBATCH_PID=""
    local jid
    jid="$(head -n 1 "$T/$name.jobid" 2>/dev/null | cut -d';' -f1)"
    log "$name job ${jid:-?}: sbatch --wait status $JOB_RC"
    [ "$JOB_RC" != 124 ] || log "$name job: still running after ${limit}s"
}

show_tail() {
    echo "---- tail of $1"
    tail -n "${2:-60}" "$1" 2>/dev/null || echo "(no output file)"
}

phase "tests job (ranks: $TEST_RANKS)"
submit tests "$TESTS_TIMEOUT" 00:20:00 slurm/tests.sbatch
TESTS_OK=1
if ! "$VENV/bin/python" scripts/slurm_job_check.py tests "$JOB_OUT" "$NTASKS" 1 "$TEST_RANKS" "$JOB_RC"; then
    TESTS_OK=0
    show_tail "$JOB_OUT" 80
fi

phase "bench job ($BENCH_CASES)"
# shellcheck disable=SC2086
submit bench "$BENCH_TIMEOUT" 00:15:00 slurm/bench.sbatch $BENCH_ARGS --cases "$BENCH_CASES"
BENCH_OK=1
if ! "$VENV/bin/python" scripts/slurm_job_check.py bench "$JOB_OUT" "$T/bench.json" "$NTASKS" 1 \
        "$BENCH_CASES" "$JOB_RC"; then
    BENCH_OK=0
    show_tail "$JOB_OUT" 80
fi

# A failure on one rank ends the whole job under srun --kill-on-bad-exit too:
# tests/test_failure.py launches its 4-task jobs with srun (each must end
# within 30 s, naming the rank and the step).
phase "failures under srun"
FAIL_OK=1
if ! timeout 600 env MPIREDIST_FAILURE_LAUNCHER="srun --kill-on-bad-exit=1 --mpi=pmi2" \
        "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/test_failure.py; then
    FAIL_OK=0
fi

if [ "$TESTS_OK" = 1 ] && [ "$BENCH_OK" = 1 ] && [ "$FAIL_OK" = 1 ]; then
    log "both jobs passed their checks, and failures ended their jobs"
    exit 0
fi
die "tests job: $([ "$TESTS_OK" = 1 ] && echo ok || echo FAILED), bench job: $([ "$BENCH_OK" = 1 ] && echo ok || echo FAILED), failures: $([ "$FAIL_OK" = 1 ] && echo ok || echo FAILED)"
