"""The shared benchmark cases (``cases.json``) and XLA's plans for them.

The JSON files are looked up, in order, in

1. the folder named by the environment variable ``MPIREDIST_SHARED``;
2. ``<repository root>/../shared`` (the repository root is the folder that
   holds the ``mpiredist`` package), the layout of a development checkout;
3. the copy packaged with mpiredist (``mpiredist/bench/data``), so that an
   installed benchmark works anywhere.

Examples
--------
>>> case = get_case("c13")
>>> case.shape, scaled(case, 64).shape
((4099, 4093), (65, 63))
"""

import json
import os
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from ..core.errors import ShapeError
from ..core.layout import Layout

__all__ = ["Case", "shared_file", "load_cases", "load_xla_plans", "get_case", "scaled"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """One redistribution: ``mesh`` maps axis names to sizes (in mesh order)."""

    id: str
    mesh: dict
    shape: tuple
    src: Layout
    dst: Layout

    @property
    def short_id(self):
        """The case number, e.g. ``"c13"`` for ``"c13_uneven_transpose"``."""
        return self.id.split("_")[0]

    @classmethod
    def from_dict(cls, spec):
        return cls(spec["id"], dict(spec["mesh"]), tuple(int(n) for n in spec["shape"]),
                   Layout.from_dict(spec["src"]), Layout.from_dict(spec["dst"]))


def shared_file(name):
    """Path (or packaged resource) of the shared file ``name``; see the module doc."""
    env = os.environ.get("MPIREDIST_SHARED")
    if env and (Path(env) / name).is_file():
        return Path(env) / name
    dev = _PACKAGE_ROOT.parent / "shared" / name
    if dev.is_file():
        return dev
    packaged = resources.files(__package__).joinpath("data", name)
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(f"shared file {name!r} not found: set MPIREDIST_SHARED to the "
                            f"folder that holds it (looked in {env or '$MPIREDIST_SHARED'}, "
                            f"{dev.parent} and the packaged copy)")


def _load(name):
    return json.loads(shared_file(name).read_text())


def load_cases():
    """The cases of ``cases.json`` as a list of :class:`Case`, in file order."""
    return [Case.from_dict(c) for c in _load("cases.json")["cases"]]


def load_xla_plans():
    """Dict ``case id -> record`` of ``xla_plans.json`` (what XLA emits per case)."""
    return {c["case"]: c for c in _load("xla_plans.json")["cases"]}


def get_case(case_id):
    """The case with full id ``case_id`` or its number (``"c04"``)."""
    for case in load_cases():
        if case_id in (case.id, case.short_id):
            return case
    known = ", ".join(c.short_id for c in load_cases())
    raise KeyError(f"no shared case {case_id!r}; the cases are {known}")


def scaled(case, scale):
    """``case`` with every length divided by ``scale`` (at least 1).

    Odd lengths stay odd, so uneven cases (c13) stay uneven.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ShapeError(f"scale {scale!r} is not a positive integer")
    shape = []
    for n in case.shape:
        m = max(1, n // scale)
        if n % 2 and m % 2 == 0:
            m += 1
        shape.append(m)
    return replace(case, shape=tuple(shape))
