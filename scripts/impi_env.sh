# shellcheck shell=bash
# Use the Intel MPI carry made by scripts/impi_carry.sh: source this file
# with the carry's folder (default .impi-carry); it exports what mpi4py and
# mpiexec.hydra need, then `mpiexec.hydra -n N python ...` runs on Intel MPI.
#
#   source scripts/impi_env.sh .impi-carry
#
# PATH            the carry's bin first (mpiexec.hydra finds its proxies
#                 beside itself)
# LD_LIBRARY_PATH the carry's lib first (libmpi.so.12, libfabric.so.1)
# MPI4PY_LIBMPI   the carry's libmpi.so.12: the mpi4py wheel (>= 4) loads
#                 this file and takes its ABI as MPICH's
# I_MPI_ROOT      the carry (as Intel's own vars scripts set it)
# FI_PROVIDER_PATH the carry's lib (its lib*-fi.so providers)
# I_MPI_FABRICS   shm unless already set: one node, libfabric not loaded
# MPIREDIST_IMPI_CARRY the carry's absolute path
# For device buffers add I_MPI_OFFLOAD=1 (NVIDIA: I_MPI_OFFLOAD_MODE=cuda,
# and I_MPI_OFFLOAD_CUDA_LIBRARY if libcuda.so is not on the loader's path);
# never on a machine without a GPU, where MPI_Init then fails.
# Returns non-zero (and changes nothing) when the folder lacks a file.
impi_env() {
    local carry="${1:-.impi-carry}" f
    for f in lib/libmpi.so.12 bin/mpiexec.hydra bin/hydra_pmi_proxy bin/hydra_bstrap_proxy; do
        if [ ! -e "$carry/$f" ]; then
            echo "impi_env: $carry/$f missing (bash scripts/impi_carry.sh $carry)" >&2
            return 1
        fi
    done
    carry="$(cd "$carry" && pwd)"
    export MPIREDIST_IMPI_CARRY="$carry"
    export PATH="$carry/bin:$PATH"
    export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export MPI4PY_LIBMPI="$carry/lib/libmpi.so.12"
    export I_MPI_ROOT="$carry"
    export FI_PROVIDER_PATH="$carry/lib"
    export I_MPI_FABRICS="${I_MPI_FABRICS:-shm}"
}
impi_env "$@"
