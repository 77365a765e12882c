"""A machine profile: the figures the planner ranks plans by (pure but for reading a file).

``python -m mpiredist calibrate`` (run under ``mpiexec``) measures them on a
machine and writes a JSON profile.  The planner uses :func:`current`: the
file named by ``MPIREDIST_PROFILE``, else ``$XDG_CONFIG_HOME/mpiredist/
profile.json`` (``~/.config/mpiredist/profile.json``), else :data:`DEFAULT`.

A candidate plan's predicted time (:meth:`Profile.seconds`) sums, per step,
``rounds * alpha + bytes / beta(op, group size)``, plus the packing of
strided pieces (``all_to_all`` and ``exchange`` pack and unpack their bytes
at ``pack_rate``) and the copy of each communicating step's result block at
``memory_bandwidth`` (a ``slice`` is counted free: often a view).
``beta`` is per collective kind and group size: the measured size nearest
below the one asked (or the smallest), else ``default_beta``.  A profile
measured on two or more nodes also has ``beta_across``, the same per rank
for groups whose members are on different nodes; with a topology
(:mod:`mpiredist.planning.nodes`) the bytes of a step that cross nodes go
at those rates, the others at ``beta``.
"""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .model import ALPHA, BETA, MEMORY_BANDWIDTH

__all__ = ["Profile", "DEFAULT", "OPS", "ENV", "default_path", "load", "current"]

ENV = "MPIREDIST_PROFILE"
OPS = ("all_to_all", "all_gather", "reduce_scatter", "all_reduce", "permute", "exchange")
PACKED = {"all_to_all": 2, "exchange": 2}        # bytes packed and unpacked per byte sent
VERSION = 1


@dataclass(frozen=True)
class Profile:
    """Seconds per message, bytes per second per op and group size, copy rates.

    ``beta`` is a tuple of ``(op, group size, bytes/s)``, hashable so that
    plans cache by profile.
    """

    alpha: float = ALPHA
    default_beta: float = BETA
    beta: tuple = ()
    pack_rate: float = MEMORY_BANDWIDTH / 4
    datatype_rate: float = MEMORY_BANDWIDTH / 16
    memory_bandwidth: float = MEMORY_BANDWIDTH
    source: str = field(default="built-in default", compare=False)
    meta: tuple = field(default=(), compare=False)
    beta_across: tuple = ()     # (op, group size, bytes/s) of bytes that cross nodes

    @property
    def key(self):
        """A short digest of the figures: ranks must plan under the same profile."""
        import hashlib
        text = repr((self.alpha, self.default_beta, self.beta, self.pack_rate,
                     self.datatype_rate, self.memory_bandwidth)
                    + ((self.beta_across,) if self.beta_across else ()))
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def beta_for(self, op, group, across=False):
        """Bytes per second of ``op`` on ``group`` ranks (module docstring);
        ``across``: of bytes that cross nodes (the within-node rate where the
        profile has none)."""
        table = self.beta_across if across and self.beta_across else self.beta
        sizes = sorted((g, b) for o, g, b in table if o == op)
        if not sizes:
            return self.default_beta
        below = [b for g, b in sizes if g <= group]
        return below[-1] if below else sizes[0][1]

    def step_seconds(self, op, nbytes, rounds, group, local_bytes=0, across_bytes=0):
        """Predicted seconds of one step (module docstring): with
        ``across_bytes``, that part of ``nbytes`` goes at the across-node rate."""
        if op == "slice":                   # a view of the block, or one local copy
            return 0.0
        copy = local_bytes / self.memory_bandwidth      # the step writes its result
        if nbytes == 0:
            return copy
        across = min(across_bytes, nbytes) if self.beta_across else 0
        return (copy + rounds * self.alpha + (nbytes - across) / self.beta_for(op, group)
                + (across / self.beta_for(op, group, True) if across else 0.0)
                + PACKED.get(op, 0) * nbytes / self.pack_rate)

    def to_dict(self):
        beta, across = {}, {}
        for op, g, b in self.beta:
            beta.setdefault(op, {})[str(g)] = b
        for op, g, b in self.beta_across:
            across.setdefault(op, {})[str(g)] = b
        out = {"version": VERSION, "alpha": self.alpha, "default_beta": self.default_beta,
               "beta": beta, "pack_rate": self.pack_rate, "datatype_rate": self.datatype_rate,
               "memory_bandwidth": self.memory_bandwidth, **dict(self.meta)}
        if across:
            out["beta_across"] = across
        return out

    @classmethod
    def from_dict(cls, doc, source="a dict"):
        """The profile of a calibrate JSON object (ValueError if malformed)."""
        try:
            beta = tuple(sorted((op, int(g), float(b)) for op, sizes in doc["beta"].items()
                                for g, b in sizes.items()))
            across = tuple(sorted((op, int(g), float(b)) for op, sizes in
                                  doc.get("beta_across", {}).items() for g, b in sizes.items()))
            out = cls(float(doc["alpha"]), float(doc.get("default_beta", BETA)), beta,
                      float(doc["pack_rate"]), float(doc["datatype_rate"]),
                      float(doc.get("memory_bandwidth", MEMORY_BANDWIDTH)), source,
                      tuple(sorted((k, v) for k, v in doc.items() if k not in _FIELDS
                                   and isinstance(v, (str, int, float)))), across)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"profile {source}: not a calibrate profile ({exc!r})") from None
        rates = [out.default_beta, out.pack_rate, out.datatype_rate, out.memory_bandwidth]
        if out.alpha < 0 or min(rates + [b for _, _, b in beta + across]) <= 0:
            raise ValueError(f"profile {source}: rates must be positive and alpha >= 0")
        return out


_FIELDS = {"version", "alpha", "default_beta", "beta", "pack_rate", "datatype_rate",
           "memory_bandwidth", "beta_across"}
# Without a calibrated profile the choice stays what the byte counts made it
# before profiles existed (measured on the shared cases at 8 ranks, 8 MiB
# blocks: an exchange sending 8 MiB took 0.69-0.96x the time of a
# collective plan sending 10-14 MiB): an exchange is taken where it sends at
# least 15 % fewer bytes (its beta is 0.85 of the others'), and packing is
# not priced (a calibrated profile measures it).
DEFAULT = Profile(beta=(("exchange", 1, BETA * 0.85),), pack_rate=1e18, datatype_rate=1e18)


def default_path():
    """Where calibrate writes and the planner looks by default."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "mpiredist" / "profile.json"


def load(path):
    """The :class:`Profile` in the JSON file ``path``."""
    with open(path, encoding="utf-8") as f:
        return Profile.from_dict(json.load(f), str(path))


_LOADED = {}


def current():
    """The profile in force: ``MPIREDIST_PROFILE``, the default file, or DEFAULT.

    Read once per path and modification time.  A named file that cannot be
    read raises; a missing default file means DEFAULT.
    """
    named = os.environ.get(ENV, "").strip()
    path = Path(named) if named else default_path()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        if named:
            raise ValueError(f"{ENV}={named}: no such profile file") from None
        return DEFAULT
    key = (str(path), stamp)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load(path)
    return _LOADED[key]
