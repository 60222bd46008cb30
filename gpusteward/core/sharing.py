"""What the GPU resources of a node or a pod stand for in physical GPUs (time-slicing, MPS, MIG,
HAMi): the one home of a pod's share, which the fleet view, quotas, the queue and the report use.

Read from what GPU Feature Discovery and the NVIDIA device plugin publish
(k8s-device-plugin `internal/lm/resource.go`, `internal/lm/mig-strategy.go`):

* time-slicing: `nvidia.com/gpu.replicas` = R and allocatable is GPUs x R, of `nvidia.com/gpu`
  or, with `renameByDefault`, of `nvidia.com/gpu.shared`; one unit is 1/R of a GPU. GFD writes
  replicas 0 on MIG-enabled GPUs and where sharing is off: both count as 1.
* MPS (`sharing.mps`): the same replicas label and units, `nvidia.com/gpu.sharing-strategy: mps`
  instead of `time-slicing` (`internal/lm/resource.go` writes both from the replicated resources
  the two strategies share); one unit is 1/R of a GPU here too.
* HAMi: allocatable is GPUs x ``deviceSplitCount`` (its node annotation says per device), so a
  unit is 1/split of a GPU for the node's count; but a HAMi pod holds the share its slice gives
  (core/hami.py: cores, else memory, else the whole GPU), not 1/split per vGPU.
* MIG mixed strategy: one resource per profile, `nvidia.com/mig-<profile>`; MIG single
  strategy: `nvidia.com/gpu` on a node whose product is `<card>-MIG-<profile>`. One unit is a
  GPU instance: its compute slices of the card's (a `1g.10gb` of an A100/H100's 7 is 1/7).

Telemetry follows the same units: dcgm-exporter reports one series per physical GPU when it is
time-sliced (replica ids `<uuid>::<n>` map to the GPU) and one per MIG instance.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

from gpusteward.core import hami
from gpusteward.core.cards import mig_profile, physical_card
from gpusteward.core.model import Node, Pod

REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
FULL_GPU = "nvidia.com/gpu"
# Compute slices of a whole card; A30 is the one MIG card with 4 (NVIDIA MIG user guide).
_CARD_SLICES = {"A30": 4}
_DEFAULT_SLICES = 7
_SLICES = re.compile(r"(?:(\d+)c\.)?(\d+)g\.")  # `1g.10gb`, `1c.2g.20gb` (a compute instance)


def replicas(node: Node | None) -> int:
    """Units of allocatable per physical GPU: GFD's replicas, or HAMi's split."""
    if node is None:
        return 1
    if node.vgpus:
        return hami.split(node.vgpus)
    try:
        return max(1, int(node.labels.get(REPLICAS_LABEL, "1")))
    except ValueError:
        return 1


def card_slices(product: str | None) -> int:
    model = physical_card(product or "").removeprefix("NVIDIA-").split("-")[0]
    return _CARD_SLICES.get(model, _DEFAULT_SLICES)


def profile_fraction(profile: str, product: str | None) -> float:
    """One instance of a MIG profile as a fraction of its card (1.0 for a name not understood)."""
    m = _SLICES.match(profile)
    if not m:
        return 1.0
    slices = int(m.group(1) or m.group(2))
    return min(1.0, slices / card_slices(product))


def unit_share(resource: str, node: Node | None) -> float:
    """One unit of `resource` on `node`, in physical GPUs."""
    return _unit_share(resource, node.product if node else None, replicas(node))


@lru_cache(maxsize=1024)
def _unit_share(resource: str, product: str | None, shares: int) -> float:
    """Cached: quotas and the report price every pod each cycle, and the product's card and
    profile take two regular expressions (20,000 pods: 120 ms -> 10 ms)."""
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return profile_fraction(resource.removeprefix(MIG_RESOURCE_PREFIX), product)
    profile = mig_profile(product) if product else None
    whole = profile_fraction(profile, product) if profile else 1.0
    return whole / shares


def physical(resources: Mapping[str, int], total: int, node: Node | None) -> float:
    """Physical GPUs behind a request or an allocatable (`total` units of `nvidia.com/gpu` when
    the per-resource split is not known)."""
    if not resources:
        return total * unit_share(FULL_GPU, node)
    return sum(count * unit_share(name, node) for name, count in resources.items())


def node_physical_gpus(node: Node) -> float:
    return physical(node.resources, node.gpus, node)


def pod_share(pod: Pod, node: Node | None) -> float:
    """Physical GPUs the pod holds: its HAMi slices' shares where HAMi placed it, else its
    request in the node's units."""
    placed = hami.slices(pod.annotations)
    if placed:
        devices = {d.id: d for d in node.vgpus} if node else {}
        return sum(hami.share(s, devices.get(s.uuid)) for s in placed)
    return physical(pod.resources, pod.gpus, node)


def devices_held(pod: Pod, node: Node | None) -> int:
    """How many physical GPUs the pod's request spans, i.e. how many device series it can have:
    one per HAMi slice (each on its own GPU), one per GPU otherwise, one where the node shares
    each GPU among replicas (they may all be on one)."""
    placed = hami.slices(pod.annotations)
    if placed:
        return len({s.uuid for s in placed})
    return pod.gpus if replicas(node) == 1 else 1


def pod_shares(pods: Iterable[Pod], nodes: Mapping[str, Node]) -> dict[str, float]:
    """pod_share of every bound pod, by uid; pods asking alike on one node priced once (quotas
    weigh every running pod each cycle: 20,000 pods, 50 ms -> 10 ms)."""
    priced: dict[tuple[str, int, tuple[tuple[str, int], ...], str | None], float] = {}
    out = {}
    for p in pods:
        if p.node is None:
            continue
        # everything pod_share reads of the pod: its request and HAMi's allocation
        key = (p.node, p.gpus, tuple(p.resources.items()), p.annotations.get(hami.ALLOCATED))
        if key not in priced:
            priced[key] = pod_share(p, nodes.get(p.node))
        out[p.uid] = priced[key]
    return out
