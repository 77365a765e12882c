#!/usr/bin/env bash
# Build the Intel MPI carry: the subset of the PyPI impi-rt wheel that runs
# mpi4py and mpiexec.hydra on one node of another Linux x86_64 machine that
# has mpi4py but no MPI library (the lent GPU machine), in an ignored folder
# (default .impi-carry, never committed), at most 60 MiB.
#
#   bash scripts/impi_carry.sh [DEST]
#   source scripts/impi_env.sh DEST     # then: mpiexec.hydra -n 2 python ...
#
# The files come from MPIREDIST_IMPI_VENV (default .venv-impi) when it holds
# impi-rt MPIREDIST_IMPI_VERSION (default 2021.18.1), else from a
# `pip install --prefix` of that wheel into a temporary folder.  What is
# taken, in the wheel's own layout (libmpi.so.12 finds opt/mpi/etc beside
# its lib folder):
#   lib/libmpi.so.12       the library (needs only librt, libdl, libm, libc);
#                          it dlopens libcuda.so itself when I_MPI_OFFLOAD=1
#   lib/libfabric.so.1, lib/libshm-fi.so, lib/libtcp-fi.so, lib/librxm-fi.so
#                          libfabric and its one-node providers: not loaded
#                          with I_MPI_FABRICS=shm (impi_env.sh's default),
#                          there for I_MPI_FABRICS=shm:ofi (libshm-fi.so also
#                          needs the system's libatomic.so.1)
#   bin/mpiexec.hydra, bin/hydra_bstrap_proxy, bin/hydra_pmi_proxy
#                          the launcher and the two programs it starts on one
#                          node (strace -f -e execve)
#   bin/mpiexec            a two-line script that execs mpiexec.hydra (the
#                          wheel's bin/mpiexec is a 4.6 MB copy of it), for
#                          scripts that look for `mpiexec` on PATH
#   bin/IMB-MPI1-GPU       Intel's MPI benchmarks on device buffers (it
#                          dlopens libcudart.so): a probe of the library's
#                          own device bandwidth, apart from mpiredist
#   opt/mpi/etc/coll.fatbin, *.conf, tuning_*_shm.dat
#                          the CUDA kernels of the GPU collectives, the
#                          collective and point-to-point settings, and the
#                          shared-memory tuning files (one per CPU family;
#                          the library picks its own)
# Debug sections are stripped (strip --strip-debug) where that leaves the
# file smaller; MANIFEST lists every file with its size and sha256.  Exit
# status 1 when something is missing or the folder exceeds the limit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST="${1:-.impi-carry}"
VERSION="${MPIREDIST_IMPI_VERSION:-2021.18.1}"
VENV="${MPIREDIST_IMPI_VENV:-.venv-impi}"
LIMIT_MIB=60

log() { printf '[impi_carry] %s\n' "$*" >&2; }

src=""
if [ -x "$VENV/bin/python" ] && [ -e "$VENV/lib/libmpi.so.12" ] \
        && [ "$("$VENV/bin/python" -m pip show impi-rt 2>/dev/null \
                | awk '$1 == "Version:" { print $2 }')" = "$VERSION" ]; then
    src="$VENV"
    log "from $src (impi-rt $VERSION installed there)"
else
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/impi-wheel.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    log "pip install --prefix $tmp --no-deps impi-rt==$VERSION"
    "${PYTHON:-python3}" -m pip install -q --no-deps --no-compile --prefix "$tmp" \
        "impi-rt==$VERSION"
    src="$tmp"
fi

files=(lib/libmpi.so.12 lib/libfabric.so.1 lib/libshm-fi.so lib/libtcp-fi.so
       lib/librxm-fi.so bin/mpiexec.hydra bin/hydra_bstrap_proxy bin/hydra_pmi_proxy
       bin/IMB-MPI1-GPU opt/mpi/etc/coll.fatbin)
for f in "$src"/opt/mpi/etc/*.conf "$src"/opt/mpi/etc/tuning_*_shm.dat; do
    [ -e "$f" ] && files+=("${f#"$src"/}")
done

rm -rf "$DEST"
mkdir -p "$DEST"
for f in "${files[@]}"; do
    if [ ! -e "$src/$f" ]; then
        log "error: $src/$f missing"
        exit 1
    fi
    mkdir -p "$DEST/$(dirname "$f")"
    cp "$src/$f" "$DEST/$f"
    if [ "${f#opt/}" = "$f" ] && command -v strip >/dev/null; then
        before="$(stat -c %s "$DEST/$f")"
        if strip --strip-debug -o "$DEST/$f.stripped" "$DEST/$f" 2>/dev/null \
                && [ "$(stat -c %s "$DEST/$f.stripped")" -lt "$before" ]; then
            chmod --reference="$DEST/$f" "$DEST/$f.stripped"
            mv "$DEST/$f.stripped" "$DEST/$f"
        else
            rm -f "$DEST/$f.stripped"
        fi
    fi
done
# shellcheck disable=SC2016  # written as is, expanded when it runs
printf '#!/bin/sh\nexec "$(dirname "$0")/mpiexec.hydra" "$@"\n' > "$DEST/bin/mpiexec"
chmod 755 "$DEST/bin/mpiexec"
echo "impi-rt $VERSION" > "$DEST/VERSION"
(cd "$DEST" && find . -type f ! -name MANIFEST | sort \
    | while read -r f; do printf '%10s %s %s\n' "$(stat -c %s "$f")" \
        "$(sha256sum "$f" | cut -c1-64)" "${f#./}"; done) > "$DEST/MANIFEST"

bytes="$(du -sb "$DEST" | cut -f1)"
mib="$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')"
log "$DEST: ${#files[@]} files, $mib MiB ($bytes bytes; limit $LIMIT_MIB MiB)"
if [ "$bytes" -gt $((LIMIT_MIB << 20)) ]; then
    log "error: over the $LIMIT_MIB MiB limit"
    exit 1
fi
