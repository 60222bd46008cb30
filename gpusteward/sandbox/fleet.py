"""Simulated GPU fleets: a fleet file of node pools becomes kwok-managed Nodes with GFD labels.

    pools:
      - name: h100                     # node names: h100-0, h100-1, ...
        count: 2
        product: NVIDIA-H100-80GB-HBM3 # the GFD nvidia.com/gpu.product label
        gpus: 8
        memoryMiB: 81559
        labels: {topology.kubernetes.io/zone: zone-a}
        taints: [{key: dedicated, value: training, effect: NoSchedule}]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import yaml

from gpusteward.core.typedconfig import decode

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Sandbox knobs on Nodes: every GPU of the node reports this XID / temperature.
XID_LABEL = "sandbox.gpusteward.io/xid"
TEMP_LABEL = "sandbox.gpusteward.io/gpu-temp"

_FAMILY = {"H100": "hopper", "H200": "hopper", "A100": "ampere", "A10": "ampere",
           "L4": "ada-lovelace",
           "L40S": "ada-lovelace", "T4": "turing", "B200": "blackwell"}


class TaintSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    key: str
    effect: str
    value: str = ""


class Pool(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    product: str
    count: Annotated[int, msgspec.Meta(ge=0)] = 1
    gpus: Annotated[int, msgspec.Meta(ge=0)] = 8
    memory_mi_b: Annotated[int, msgspec.Meta(ge=0)] = 81559
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    taints: list[TaintSpec] = msgspec.field(default_factory=list)

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]


class Fleet(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pools: list[Pool]


DEFAULT_FLEET = Fleet(pools=[
    Pool(name="h100", product="NVIDIA-H100-80GB-HBM3", count=2, gpus=8, memory_mi_b=81559),
    Pool(name="a100", product="NVIDIA-A100-SXM4-80GB", count=2, gpus=8, memory_mi_b=81920),
    Pool(name="l4", product="NVIDIA-L4", count=3, gpus=4, memory_mi_b=23034),
])


class FleetError(ValueError):
    pass


def load_fleet(path: str | Path) -> Fleet:
    data = yaml.safe_load(Path(path).read_text())
    fleet, errors = decode(data, Fleet)
    if errors:
        raise FleetError(f"invalid fleet file {path}:\n" + "\n".join(f"  - {e}" for e in errors))
    return fleet


def family(product: str) -> str:
    model = product.removeprefix("NVIDIA-").split("-")[0]
    return _FAMILY.get(model, "unknown")


def node_object(pool: Pool, name: str) -> dict[str, Any]:
    """A Node as the kubelet + GPU Feature Discovery would publish it."""
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", "gpusteward.io/pool": pool.name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": pool.product,
        "nvidia.com/gpu.count": str(pool.gpus),
        "nvidia.com/gpu.memory": str(pool.memory_mi_b),
        "nvidia.com/gpu.family": family(pool.product),
        "nvidia.com/gpu.sharing-strategy": "none",
        **pool.labels,
    }
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(pool.gpus)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
        "spec": {"taints": [msgspec.to_builtins(t) for t in pool.taints]},
        "status": {"capacity": resources, "allocatable": resources, "phase": "Running"},
    }


def node_objects(fleet: Fleet) -> list[dict[str, Any]]:
    return [node_object(pool, name) for pool in fleet.pools for name in pool.node_names()]

