"""Which node each device is on: a pure value that planning takes without MPI.

A :class:`Topology` numbers the nodes of a mesh's devices (``node(d)``),
0, 1, ... in order of their first device.  ``Topology.uniform(nodes,
per_node)`` puts device ``d`` on node ``d // per_node``: what a planner at
scale assumes, and what a job of ``per_node`` ranks on each node gives when
ranks are numbered node by node (Slurm's block distribution, ``mpirun
--map-by node`` aside).  On MPI the runtime builds the topology of a
communicator from ``Split_type(COMM_TYPE_SHARED)``
(:func:`mpiredist.runtime.groups.topology`), and a mesh over a subset or a
reordering of its ranks takes its devices' nodes (:meth:`Topology.devices`).

Examples
--------
>>> t = Topology.uniform(2, 4)
>>> t.node(5), t.count, t.per_node
(1, 2, 4)
>>> Topology([7, 7, 3, 3]) == Topology.uniform(2, 2)
True
"""

import numpy as np

from .errors import MeshError

__all__ = ["Topology"]


class Topology:
    """The node of each device (see the module doc).

    Parameters
    ----------
    nodes : sequence
        A node label per device (any hashable labels: names, numbers);
        devices with equal labels share a node.  Relabelled 0, 1, ... in order
        of first appearance.
    """

    __slots__ = ("_uniform", "_nodes")

    def __init__(self, nodes):
        labels, seen = [], {}
        for label in nodes:
            labels.append(seen.setdefault(label, len(seen)))
        if not labels:
            raise MeshError("a topology needs at least one device")
        self._nodes = tuple(labels)
        self._uniform = _uniform_of(self._nodes)

    @classmethod
    def uniform(cls, nodes, per_node):
        """``nodes`` nodes of ``per_node`` devices: device ``d`` on node ``d // per_node``."""
        for name, value in (("nodes", nodes), ("per_node", per_node)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise MeshError(f"Topology.uniform: {name} must be a positive integer, "
                                f"found {value!r}")
        self = object.__new__(cls)
        self._uniform, self._nodes = (int(nodes), int(per_node)), None
        return self

    def __setattr__(self, name, value):
        if name in self.__slots__ and not hasattr(self, name):
            object.__setattr__(self, name, value)
        else:
            raise AttributeError("Topology is immutable")

    @property
    def size(self):
        """Number of devices."""
        if self._uniform is not None:
            return self._uniform[0] * self._uniform[1]
        return len(self._nodes)

    @property
    def count(self):
        """Number of nodes."""
        if self._uniform is not None:
            return self._uniform[0]
        return max(self._nodes) + 1

    @property
    def per_node(self):
        """Devices per node when every node has as many (else None)."""
        if self._uniform is not None:
            return self._uniform[1]
        counts = np.bincount(self.array())
        return int(counts[0]) if (counts == counts[0]).all() else None

    @property
    def is_uniform(self):
        """True if device ``d`` is on node ``d // per_node``."""
        return self._uniform is not None

    def node(self, device):
        """The node of ``device``."""
        if not 0 <= device < self.size:
            raise MeshError(f"device {device} is outside {self} of {self.size} devices")
        if self._uniform is not None:
            return device // self._uniform[1]
        return self._nodes[device]

    def array(self):
        """The node of every device, as an int64 array."""
        if self._uniform is not None:
            nodes, per = self._uniform
            return np.arange(nodes * per, dtype=np.int64) // per
        return np.array(self._nodes, dtype=np.int64)

    def devices(self, ranks):
        """The topology of a mesh whose device ``d`` is rank ``ranks[d]`` of this one."""
        nodes = self.array()
        return Topology(nodes[list(ranks)].tolist())

    def _key(self):
        return ("uniform",) + self._uniform if self._uniform is not None else self._nodes

    def __eq__(self, other):
        return isinstance(other, Topology) and self._key() == other._key()

    def __hash__(self):
        return hash(("Topology", self._key()))

    def __repr__(self):
        if self._uniform is not None:
            return f"Topology.uniform({self._uniform[0]}, {self._uniform[1]})"
        return f"Topology({list(self._nodes)!r})"

    def __str__(self):
        if self._uniform is not None:
            return f"{self._uniform[0]} node(s) x {self._uniform[1]}"
        return "nodes " + ",".join(map(str, self._nodes))


def _uniform_of(nodes):
    """``(nodes, per_node)`` if device d is on node d // per_node, else None."""
    per = nodes.count(0)
    n = len(nodes) // per if per else 0
    if per and n * per == len(nodes) and all(v == i // per for i, v in enumerate(nodes)):
        return n, per
    return None
