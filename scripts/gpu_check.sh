#!/usr/bin/env bash
# The device check, one script: CuPy arrays and torch CUDA tensors through
# mpiredist on one GPU, under each MPI it is given, then the torch.distributed
# transport over NCCL.
#
#   bash scripts/gpu_check.sh --mpich wheels/ --impi .impi-carry   # a GPU machine
#   bash scripts/gpu_check.sh wheels/                  # PyPI MPICH only (as before)
#   bash scripts/gpu_check.sh --fake                   # a CPU: fake CuPy, gloo
#
# Per MPI (PyPI MPICH from its wheel, installed with --no-index into this
# Python: not CUDA-aware, so staged; Intel MPI from the carry that
# scripts/impi_carry.sh makes, with I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda:
# CUDA-aware):
#   scripts/gpu_check.py at MPIREDIST_GPU_RANKS (default "2 4") ranks sharing
#     the GPU: every shared case at scale MPIREDIST_GPU_SCALE (default 64),
#     staged, aware where the library says so, and the host round trip,
#     against the oracle, device peak against max(S, T) + W;
#   scripts/gpu_sizes.py at 2 ranks: all-to-all, all-gather, reduce-scatter
#     at MPIREDIST_GPU_SIZES MiB per rank (default 1,4,16,64,256), aware,
#     staged, host round trip and a device-to-device copy of the same bytes
#     (the floor), host bytes touched, device peak; JSON in $OUT.
# Then scripts/nccl_check.py under torchrun, 1 rank (NCCL puts no two ranks
# on one GPU before NCCL 2.30): every TorchGroup operation on CUDA memory,
# a CUDA DTensor and a Transfer on mr.torch.mesh.
#
# Logs and JSON go to $OUT (default ./gpu-out).  Every launch is bounded by
# `timeout`; the whole check takes about 3-4 minutes of device time.  With
# --fake (CI, scripts/test.sh) the same scripts run on a CPU with the fake
# CuPy of tests/fakecupy.py under the mpiexec next to this Python, and
# nccl_check.py over gloo; sizes default to 1,4 MiB there.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source scripts/common.sh     # mpi_oversubscription_env: yield when ranks outnumber cores
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
FAKE=()
MPICH_WHEELS="" IMPI_CARRY=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --fake) FAKE=(--fake) ;;
        --mpich) MPICH_WHEELS="$2"; shift ;;
        --impi) IMPI_CARRY="$2"; shift ;;
        *) MPICH_WHEELS="$1" ;;
    esac
    shift
done
RANKS=${MPIREDIST_GPU_RANKS:-2 4}
SCALE=${MPIREDIST_GPU_SCALE:-64}
if [[ ${#FAKE[@]} -gt 0 ]]; then SIZES=${MPIREDIST_GPU_SIZES:-1,4}; else
    SIZES=${MPIREDIST_GPU_SIZES:-1,4,16,64,256}; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
SUMMARY=()

run_mpi() {  # NAME MPIEXEC [VAR=value ...]: gpu_check.py at RANKS, gpu_sizes.py at 2
    local name="$1" mpiexec="$2" n r
    shift 2
    for n in $RANKS; do
        r=0
        # shellcheck disable=SC2046  # VAR=value words
        env "$@" $(mpi_oversubscription_env "$n") timeout 180 "$mpiexec" -n "$n" "$PY" \
            scripts/gpu_check.py "${FAKE[@]}" --scale "$SCALE" 2>&1 \
            | tee "$OUT/gpu_check_${name}_$n.txt" || r=1
        grep -q "^gpu_check: PASSED" "$OUT/gpu_check_${name}_$n.txt" || r=1
        SUMMARY+=("gpu_check.py  $name np=$n: $([ $r = 0 ] && echo ok || echo FAILED)")
        [ $r = 0 ] || rc=1
    done
    r=0
    # shellcheck disable=SC2046
    env "$@" $(mpi_oversubscription_env 2) timeout 300 "$mpiexec" -n 2 "$PY" \
        scripts/gpu_sizes.py "${FAKE[@]}" --sizes "$SIZES" --json "$OUT/gpu_sizes_$name.json" \
        2>&1 | tee "$OUT/gpu_sizes_$name.txt" || r=1
    grep -q "^gpu_sizes: PASSED" "$OUT/gpu_sizes_$name.txt" || r=1
    SUMMARY+=("gpu_sizes.py  $name np=2: $([ $r = 0 ] && echo ok || echo FAILED)")
    [ $r = 0 ] || rc=1
}

if [[ ${#FAKE[@]} -gt 0 ]]; then
    MPIEXEC=$(dirname "$(command -v "$PY")")/mpiexec
    [[ -x "$MPIEXEC" ]] || MPIEXEC=$(command -v mpiexec) || { echo "no mpiexec" >&2; exit 2; }
    run_mpi fake "$MPIEXEC" MPIREDIST_GPU_CHECK=fake
fi
if [[ -n "$MPICH_WHEELS" ]]; then
    "$PY" -m pip install -q --no-index --find-links "$MPICH_WHEELS" mpich || exit 2
    run_mpi mpich "$(dirname "$(command -v "$PY")")/mpiexec" MPIREDIST_GPU_CHECK=mpich
fi
if [[ -n "$IMPI_CARRY" ]]; then
    # Intel MPI's GPU layer must be on before MPI_Init (mpiredist never sets it)
    (
        # shellcheck source=impi_env.sh
        source scripts/impi_env.sh "$IMPI_CARRY"
        run_mpi impi "$(command -v mpiexec.hydra)" I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda
        printf '%s\n' "${SUMMARY[@]}" > "$OUT/summary_impi.txt"
        exit $rc
    ) || rc=1
    [ -f "$OUT/summary_impi.txt" ] && mapfile -t -O "${#SUMMARY[@]}" SUMMARY \
        < <(grep impi "$OUT/summary_impi.txt")
fi
TORCHRUN=$(dirname "$(command -v "$PY")")/torchrun
if [[ -x "$TORCHRUN" ]]; then
    r=0
    env -u PMI_RANK timeout 180 "$TORCHRUN" --nproc-per-node 1 scripts/nccl_check.py \
        "${FAKE[@]}" 2>&1 | tee "$OUT/nccl_check.txt" || r=1
    grep -q "^nccl_check: PASSED" "$OUT/nccl_check.txt" || r=1
    SUMMARY+=("nccl_check.py torchrun np=1: $([ $r = 0 ] && echo ok || echo FAILED)")
    [ $r = 0 ] || rc=1
else
    SUMMARY+=("nccl_check.py: skipped (no torchrun next to $PY)")
fi
echo
echo "gpu_check.sh summary (logs and JSON in $OUT):"
printf '  %s\n' "${SUMMARY[@]}"
grep -h "^staged vs\|^aware vs" "$OUT"/gpu_sizes_*.txt 2>/dev/null | sed 's/^/  /'
exit $rc
