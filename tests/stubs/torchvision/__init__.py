"""A stub of torchvision for HeAT on a CPU-only torch (HeAT imports it at start-up
for its vision helpers, which mpiredist does not use)."""
from . import datasets, transforms  # noqa: F401
