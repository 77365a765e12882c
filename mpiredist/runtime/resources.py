"""The memory a rank can use: the pre-check that a call's bound fits, before data moves.

A call allocates at most its bound (max(S, T) + W, or max(0, T - S) + W
donated).  A job whose bound does not fit is otherwise killed by the
operating system or the batch system, at scale and after minutes.  So each
checked run compares its bound with the least of what the sources below
allow this rank, and raises :class:`~mpiredist.MemoryBudgetError` (through
the agreement: on every rank, before any data moves) when it does not fit:

- ``MPIREDIST_MEMORY_LIMIT``: the bytes a call may newly allocate on each
  rank (``2G``, ``512M``, ``64K`` or plain bytes), which overrides the
  others;
- the cgroup's limit less its usage (v2 ``memory.max`` / ``memory.current``,
  v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``), shared by the
  ranks of the node;
- ``MemAvailable`` of ``/proc/meminfo``, shared by the ranks of the node;
- Slurm's ``--mem`` (``SLURM_MEM_PER_NODE``, shared by the node's ranks) or
  ``--mem-per-cpu`` (``SLURM_MEM_PER_CPU`` times ``SLURM_CPUS_PER_TASK``),
  less this process's resident set;
- ``ulimit -v`` (``RLIMIT_AS``) less this process's address space.

Where a source is missing it does not count; where none is found nothing
is checked.  The files to read, ``MPIREDIST_MEMORY_LIMIT`` and Slurm's
variables are found once per Transfer (:class:`Resources`), as Slurm sets
them when the job starts; a check reads a few small files (0.1-0.3 ms), or
reuses a reading of the last second when its bound is at most a quarter
of what that reading allowed and ``ulimit -v`` is unchanged.
"""

import os
import re
import time

try:
    import resource
except ImportError:         # not on every platform
    resource = None

from ..core.errors import MemoryBudgetError

__all__ = ["ENV", "parse_bytes", "Resources"]

ENV = "MPIREDIST_MEMORY_LIMIT"
# A reading of the sources is reused for this long, for bounds up to this share of it.
REUSE_SECONDS = 1.0
REUSE_SHARE = 0.25
_SHARED = ("the cgroup's memory limit", "MemAvailable", "Slurm's --mem")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_NUMBER = re.compile(r"\s*(\d+)\s*([KMGT]?)(I?B)?\s*\Z", re.I)


def parse_bytes(text):
    """``"2G"`` -> 2147483648 (K, M, G, T are powers of 1024; ``KiB`` and ``KB`` alike)."""
    found = _NUMBER.match(str(text))
    if not found:
        raise ValueError(f"{ENV}={text!r}: expected a number of bytes such as 4G, 512M or "
                         "1048576")
    return int(found.group(1)) * _UNITS[found.group(2).upper()]


def _read_int(path):
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return None if not text.isdigit() else int(text)


def _kb_field(path, field):
    """A ``kB`` field (``VmRSS``, ``MemAvailable``...) of a /proc file in bytes, or None."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_files():
    """``(limit file, usage file)`` of this process's cgroup, or None."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid == "0" and controllers == "":                        # v2
            base = "/sys/fs/cgroup" + path
            if os.path.exists(os.path.join(base, "memory.max")):
                return os.path.join(base, "memory.max"), os.path.join(base, "memory.current")
        elif "memory" in controllers.split(","):                    # v1
            base = "/sys/fs/cgroup/memory" + path
            if os.path.exists(os.path.join(base, "memory.limit_in_bytes")):
                return (os.path.join(base, "memory.limit_in_bytes"),
                        os.path.join(base, "memory.usage_in_bytes"))
    return None


def _address_limit():
    """The soft ``RLIMIT_AS`` (the process may lower it at any time: a reading
    is reused only while it is unchanged), or None where it cannot be read."""
    if resource is None:
        return None
    try:
        return resource.getrlimit(resource.RLIMIT_AS)[0]
    except (OSError, ValueError):
        return None


def _slurm():
    """Slurm's ``(--mem-per-cpu, --mem, --cpus-per-task)`` variables, or None each."""
    return tuple(os.environ.get(k) for k in ("SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE",
                                             "SLURM_CPUS_PER_TASK"))


class Resources:
    """What this rank may allocate, from the sources of the module doc.

    ``node_ranks``: how many ranks of the job share this node (and so its
    cgroup, its ``MemAvailable`` and Slurm's per-node memory).
    """

    __slots__ = ("node_ranks", "_cgroup", "_override", "_slurm", "_last")

    def __init__(self, node_ranks=1):
        self.node_ranks = max(1, int(node_ranks))
        self._cgroup = _cgroup_files()
        text = os.environ.get(ENV, "").strip()
        self._override = parse_bytes(text) if text else None
        self._slurm = _slurm()
        self._last = None       # (monotonic seconds, _address_limit(), what available() read)

    def __repr__(self):
        return f"Resources(node_ranks={self.node_ranks}, cgroup={self._cgroup is not None})"

    def available(self, bound=None):
        """``(bytes, source)``: the least any source allows this rank now, or
        ``(None, None)`` where no source applies.

        With ``bound`` (the bytes the caller will check), a reading younger
        than :data:`REUSE_SECONDS` is reused while ``bound`` is at most a
        :data:`REUSE_SHARE` of it: the files are read again before a call
        that could come near the limit, or after a second (reading them took
        about 0.1-0.3 ms, as much as a small run's own work).
        """
        if self._override is not None:
            return self._override, ENV
        now, key = time.monotonic(), _address_limit()
        last = self._last
        if bound is not None and last is not None and now - last[0] < REUSE_SECONDS \
                and last[1] == key:
            found = last[2]
            if found[0] is None or bound <= found[0] * REUSE_SHARE:
                return found
        found = self._read()
        self._last = (now, key, found)
        return found

    def _read(self):
        found = []
        n = self.node_ranks
        if self._cgroup is not None:
            limit, usage = (_read_int(p) for p in self._cgroup)
            if limit is not None and usage is not None and limit < (1 << 60):
                found.append((max(0, limit - usage) // n, "the cgroup's memory limit"))
        mem = _kb_field("/proc/meminfo", "MemAvailable")
        if mem is not None:
            found.append((mem // n, "MemAvailable"))
        per_cpu, per_node, cpus = self._slurm
        rss = (_kb_field("/proc/self/status", "VmRSS") or 0) if per_cpu or per_node else 0
        if per_cpu and per_cpu.isdigit():
            cpus = int(cpus) if cpus and cpus.isdigit() else 1
            found.append((max(0, int(per_cpu) * cpus * (1 << 20) - rss), "Slurm's --mem-per-cpu"))
        elif per_node and per_node.isdigit() and int(per_node):
            found.append((max(0, int(per_node) * (1 << 20) // n - rss), "Slurm's --mem"))
        soft = _address_limit()
        if soft is not None and soft not in (-1, resource.RLIM_INFINITY):
            found.append((max(0, soft - (_kb_field("/proc/self/status", "VmSize") or 0)), "ulimit -v"))
        if not found:
            return None, None
        return min(found)

    @staticmethod
    def fits(bound, found):
        """True if ``bound`` bytes fit ``found`` (what :meth:`available` said)."""
        return found[0] is None or bound <= found[0]

    def check(self, bound, rank, what, found=None):
        """MemoryBudgetError unless ``bound`` bytes fit what this rank may allocate
        (``found``: what :meth:`available` said, read now if not given; a
        reading of the last second that allowed four times ``bound`` or more,
        ``ulimit -v`` unchanged, is taken at once)."""
        if found is None:
            last = self._last
            if last is not None and time.monotonic() - last[0] < REUSE_SECONDS \
                    and (last[2][0] is None or bound <= last[2][0] * REUSE_SHARE) \
                    and last[1] == _address_limit():
                return
            found = self.available(bound)
        have, source = found
        if have is not None and bound > have:
            shared = source in _SHARED and self.node_ranks > 1
            raise MemoryBudgetError(
                f"rank {rank}: {what} may allocate {bound} B, but {have} B are available "
                f"({source}{f', shared by {self.node_ranks} ranks on this node' if shared else ''})")
