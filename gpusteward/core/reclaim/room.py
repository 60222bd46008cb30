"""Free capacity for queue enforcement: what a waiting pod needs, and what reclaiming frees.

Most nodes count in units of their allocatable (GPUs, replicas, MIG instances): a pod needs its
request and a victim frees its own. A node whose GPUs HAMi slices (core/hami.py) has vGPU slots
to spare long before its GPUs are full, so its units say little: there a waiting pod needs,
for each vGPU it asks, one device with a slot, the memory and the cores it asks left (HAMi's
own Fit), and a victim frees its slices' cores and memory on their devices. Reclaiming for a
waiting pod therefore frees a HAMi pod's share, not a slot.

Not counted on HAMi devices: a reservation held for a waiting pod (reserve.py) is kept in
units only, since HAMi picks its devices when it places the pod.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

from gpusteward.core import hami
from gpusteward.core.model import Node, Pod


class Room:
    """Each node's free units and, on HAMi nodes, each device's load."""

    def __init__(self, units: dict[str, int],
                 devices: dict[str, dict[str, hami.DeviceLoad]] | None = None) -> None:
        self.units = units
        self.devices = devices or {}

    @classmethod
    def of(cls, units: dict[str, int], nodes: Mapping[str, Node],
           bound: Iterable[Pod]) -> Room:
        """``units`` free per node, and the HAMi nodes' devices under ``bound``'s slices."""
        placed: dict[str, list[hami.Slice]] = {}
        for p in bound:
            if p.node is not None and p.node in nodes and nodes[p.node].vgpus:
                placed.setdefault(p.node, []).extend(hami.slices(p.annotations))
        return cls(units, {name: hami.loads(n.vgpus, placed.get(name, ()))
                           for name, n in nodes.items() if n.vgpus})

    def copy(self) -> Room:
        return Room(dict(self.units), copy.deepcopy(self.devices))

    def free(self, node: str) -> int:
        return self.units.get(node, 0)

    def fits(self, pending: Pod, node: str, victims: Iterable[Pod] = ()) -> bool:
        """Whether ``pending`` fits on ``node`` once ``victims`` are gone."""
        victims = list(victims)
        if self.free(node) + sum(v.gpus for v in victims) < pending.gpus:
            return False
        if node not in self.devices:
            return True
        devices = copy.deepcopy(self.devices[node])
        _release(devices, victims)
        return hami.place(devices.values(), _asks(pending)) is not None

    def take(self, pending: Pod, node: str, victims: Iterable[Pod]) -> None:
        """The victims gone from ``node`` and ``pending`` placed there."""
        victims = list(victims)
        self.units[node] = self.free(node) + sum(v.gpus for v in victims) - pending.gpus
        if node in self.devices:
            _release(self.devices[node], victims)
            hami.place(self.devices[node].values(), _asks(pending))


def _asks(pending: Pod) -> tuple[hami.Ask, ...]:
    """What the pod asks of a HAMi node; a pod whose asks were not read, whole GPUs."""
    return pending.vgpu_asks or (hami.Ask.of(pending.gpus, 0, None, 0),)


def _release(devices: dict[str, hami.DeviceLoad], victims: Iterable[Pod]) -> None:
    for v in victims:
        for piece in hami.slices(v.annotations):
            if piece.uuid in devices:
                devices[piece.uuid].add(piece, -1)
