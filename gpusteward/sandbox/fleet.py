"""Simulated GPU fleets: a fleet file of node pools becomes kwok-managed Nodes with GFD labels.

    pools:
      - name: h100                     # node names: h100-0, h100-1, ...
        count: 2
        product: NVIDIA-H100-80GB-HBM3 # the GFD nvidia.com/gpu.product label
        gpus: 8
        memoryMiB: 81559
        labels: {topology.kubernetes.io/zone: zone-a}
        taints: [{key: dedicated, value: training, effect: NoSchedule}]
      - name: t4                       # time-slicing: allocatable nvidia.com/gpu = 2 x 4,
        product: Tesla-T4              # product Tesla-T4-SHARED, nvidia.com/gpu.replicas=4
        gpus: 2
        replicas: 4
      - name: a100-mig                 # MIG mixed strategy: allocatable nvidia.com/mig-1g.10gb
        product: NVIDIA-A100-SXM4-80GB # = 2 x 7, the nvidia.com/mig-1g.10gb.* labels
        gpus: 2
        mig: {profile: 1g.10gb, perGpu: 7}
      - name: h100-dra                 # Dynamic Resource Allocation: no GPU allocatable and no
        product: NVIDIA-H100-80GB-HBM3 # GFD labels; the GPUs are published as a ResourceSlice
        dra: true                      # of NVIDIA's DRA driver (gpusteward.sandbox.dra)
      - name: l4-mps                   # the device plugin's sharing.mps: time-slicing's labels
        product: NVIDIA-L4             # and units, sharing-strategy mps
        replicas: 4
        sharing: mps
      - name: h100-hami                # HAMi: no GFD labels, allocatable nvidia.com/gpu = 2 x 4,
        product: NVIDIA-H100-80GB-HBM3 # the GPUs in the hami.io/node-nvidia-register annotation
        gpus: 2                        # (gpusteward.sandbox.hami)
        hami: {split: 4}

Labels are GFD's (k8s-device-plugin `internal/lm/resource.go`, `mig-strategy.go`): the shared
pool's product gets `-SHARED` and its replicas label; the MIG pool keeps the parent card's
product, `nvidia.com/gpu.replicas: 0` (GFD labels MIG-enabled GPUs without sharing),
`nvidia.com/mig.strategy: mixed` and per profile `nvidia.com/mig-<profile>.{count,product,
memory,replicas,slices.gi,slices.ci}`. An MPS pool's labels are the time-sliced pool's with
`nvidia.com/gpu.sharing-strategy: mps` (`internal/lm/resource.go`; its test fixture
`{gpu.replicas: "2", gpu.sharing-strategy: mps, gpu.product: MOCKMODEL-SHARED}`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from gpusteward.core.typedconfig import decode
from gpusteward.sandbox.hami import register_annotation

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# Sandbox knobs on Nodes: every GPU of the node reports this XID / temperature.
XID_LABEL = "sandbox.gpusteward.io/xid"
TEMP_LABEL = "sandbox.gpusteward.io/gpu-temp"
# Only these physical GPUs (comma-separated indices) report the XID, when set.
XID_GPUS_LABEL = "sandbox.gpusteward.io/xid-gpus"
# `zero`: the node's MIG instances print DCGM_FI_DEV_GPU_UTIL 0 (NVIDIA/dcgm-exporter#216)
# instead of leaving it out (#50, #430).
MIG_GPU_UTIL_LABEL = "sandbox.gpusteward.io/mig-gpu-util"
# The GPU resources the sandbox's nodes offer (sandbox/policy.yaml counts them all).
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                 "nvidia.com/mig-1g.20gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb",
                 "nvidia.com/mig-4g.40gb", "nvidia.com/mig-7g.80gb")

_FAMILY = {"H100": "hopper", "H200": "hopper", "A100": "ampere", "A10": "ampere",
           "L4": "ada-lovelace",
           "L40S": "ada-lovelace", "T4": "turing", "B200": "blackwell"}


class TaintSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    key: str
    effect: str
    value: str = ""


class MigSpec(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    profile: Annotated[str, msgspec.Meta(pattern=r"^\d+g\.\d+gb$")]
    per_gpu: Annotated[int, msgspec.Meta(ge=1, le=7)] = 7


class HamiSpec(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    split: Annotated[int, msgspec.Meta(ge=1, le=100)] = 10  # HAMi's deviceSplitCount


class Pool(msgspec.Struct, rename="camel", forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]
    product: str
    count: Annotated[int, msgspec.Meta(ge=0)] = 1
    gpus: Annotated[int, msgspec.Meta(ge=0)] = 8
    memory_mi_b: Annotated[int, msgspec.Meta(ge=0)] = 81559
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    taints: list[TaintSpec] = msgspec.field(default_factory=list)
    replicas: Annotated[int, msgspec.Meta(ge=1)] = 1  # time-slicing (or MPS) replicas per GPU
    sharing: Literal["time-slicing", "mps"] = "time-slicing"  # the device plugin's strategy
    mig: MigSpec | None = None  # every GPU partitioned alike (mixed strategy)
    dra: bool = False  # GPUs served by NVIDIA's DRA driver instead of the device plugin
    hami: HamiSpec | None = None  # GPUs split by HAMi's device plugin (sandbox/hami.py)

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]


class Fleet(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pools: list[Pool]


DEFAULT_FLEET = Fleet(pools=[
    Pool(name="h100", product="NVIDIA-H100-80GB-HBM3", count=2, gpus=8, memory_mi_b=81559),
    Pool(name="a100", product="NVIDIA-A100-SXM4-80GB", count=2, gpus=8, memory_mi_b=81920),
    Pool(name="l4", product="NVIDIA-L4", count=3, gpus=4, memory_mi_b=23034),
    # Tainted so that only pods meant for them land there: the shared and partitioned pools.
    Pool(name="t4", product="Tesla-T4", count=1, gpus=2, memory_mi_b=15360, replicas=4,
         taints=[TaintSpec(key="gpusteward.io/time-sliced", effect="NoSchedule")]),
    Pool(name="a100-mig", product="NVIDIA-A100-SXM4-80GB", count=1, gpus=2, memory_mi_b=81920,
         mig=MigSpec(profile="1g.10gb", per_gpu=7)),
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
    model = product.removeprefix("NVIDIA-").removeprefix("Tesla-").split("-")[0]
    return _FAMILY.get(model, "unknown")


def _sharing(pool: Pool) -> tuple[dict[str, str], dict[str, str]]:
    """(GFD labels, allocatable) for the pool's GPUs as the device plugin shares them."""
    if pool.mig is not None:
        profile, count = pool.mig.profile, pool.gpus * pool.mig.per_gpu
        key = f"nvidia.com/mig-{profile}"
        slices = profile.split("g.")[0]
        labels = {"nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
                  "nvidia.com/gpu.replicas": "0", f"{key}.count": str(count),
                  f"{key}.product": f"{pool.product}-MIG-{profile}",
                  f"{key}.memory": str(int(profile.split(".")[1].removesuffix("gb")) * 1024),
                  f"{key}.replicas": "1", f"{key}.slices.gi": slices,
                  f"{key}.slices.ci": slices}
        return labels, {"nvidia.com/gpu": "0", key: str(count)}
    if pool.replicas > 1:
        labels = {"nvidia.com/gpu.product": f"{pool.product}-SHARED",
                  "nvidia.com/gpu.replicas": str(pool.replicas),
                  "nvidia.com/gpu.sharing-strategy": pool.sharing}
        return labels, {"nvidia.com/gpu": str(pool.gpus * pool.replicas)}
    return {"nvidia.com/gpu.replicas": "1"}, {"nvidia.com/gpu": str(pool.gpus)}


def node_object(pool: Pool, name: str) -> dict[str, Any]:
    """A Node as the kubelet + GPU Feature Discovery would publish it (a DRA pool's: as the
    kubelet alone does; its GPUs are in ResourceSlices)."""
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", "gpusteward.io/pool": pool.name,
    }
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    annotations = {KWOK_ANNOTATION: "fake"}
    if pool.hami is not None:
        labels, resources, annotations = _hami(pool, name, labels, resources, annotations)
    elif not pool.dra:
        labels, resources = _device_plugin(pool, labels, resources)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels | pool.labels,
                     "annotations": annotations},
        "spec": {"taints": [msgspec.to_builtins(t) for t in pool.taints]},
        "status": {"capacity": resources, "allocatable": resources, "phase": "Running"},
    }


def _device_plugin(pool: Pool, labels: dict[str, str],
                   resources: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """GFD's labels and the device plugin's allocatable."""
    labels = labels | {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": pool.product,
        "nvidia.com/gpu.count": str(pool.gpus),
        "nvidia.com/gpu.memory": str(pool.memory_mi_b),
        "nvidia.com/gpu.family": family(pool.product),
        "nvidia.com/gpu.sharing-strategy": "none",
    }
    sharing, gpus = _sharing(pool)
    return labels | sharing, resources | gpus


def _hami(pool: Pool, name: str, labels: dict[str, str], resources: dict[str, str],
          annotations: dict[str, str]
          ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """HAMi's device plugin without GPU Operator: its node selector label ``gpu: on``, its
    register annotation, allocatable GPUs x split; no GFD labels."""
    assert pool.hami is not None
    split = pool.hami.split
    return (labels | {"gpu": "on"}, resources | {"nvidia.com/gpu": str(pool.gpus * split)},
            annotations | register_annotation(name, pool.gpus, split, pool.product,
                                              pool.memory_mi_b))


def node_objects(fleet: Fleet) -> list[dict[str, Any]]:
    return [node_object(pool, name) for pool in fleet.pools for name in pool.node_names()]

