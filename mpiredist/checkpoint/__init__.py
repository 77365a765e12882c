"""Checkpoints: save a state from any mesh, load it on any mesh and rank count.

- :func:`save` / :func:`load` (``mr.save``, ``mr.load``): collective, each
  rank writes its share of its blocks in parallel and reads only the byte
  ranges its target blocks need, verified by checksums
  (:mod:`~mpiredist.checkpoint.api`).
- :func:`open` (``mr.checkpoint.open``): names, shapes, dtypes and any box,
  in one process without MPI (:mod:`~mpiredist.checkpoint.store`).
- The format (docs/checkpoint-format.md): raw per-rank files and a JSON
  index (:mod:`~mpiredist.checkpoint.index`) of tiled boxes
  (:mod:`~mpiredist.checkpoint.grid`); DCP directories are read too
  (:mod:`~mpiredist.checkpoint.dcp`).

Modules: ``grid`` (tiles, pure), ``index`` (the format), ``plan`` (which
byte ranges a block needs, pure), ``reader`` and ``writer`` (per-rank I/O),
``dcp`` (DCP's metadata and storages), ``entries`` (what a state holds and
who writes what), ``collective`` (every collective a save or load runs),
``api`` (save, load), ``store`` (open).
"""

from ..core.errors import CheckpointError
from .api import load, save
from .store import Checkpoint, open  # noqa: A004 - the module's public verb

__all__ = ["save", "load", "open", "Checkpoint", "CheckpointError"]
