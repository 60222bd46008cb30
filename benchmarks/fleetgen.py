"""Synthetic fleets for benchmarks: realistic node objects, GPU pods and DCGM-like readings."""

from __future__ import annotations

import random

from gpusteward.core.model import GpuReading, Node, Pod, Telemetry

PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4", "NVIDIA-A10"]


def node_json(name: str, product: str, gpus: int = 8) -> dict:
    """A Node about the size a real kubelet reports (labels, conditions, images: ~4 KB)."""
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": "zone-a",
        "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.machine": "p5.48xlarge", "nvidia.com/cuda.driver-version.full": "550.90.07",
        "nvidia.com/mig.capable": "true", "nvidia.com/gpu.sharing-strategy": "none",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    conditions = [
        {"type": t, "status": "False", "lastHeartbeatTime": "2026-11-29T10:00:00Z",
         "lastTransitionTime": "2026-11-01T00:00:00Z", "reason": f"Kubelet{t}", "message": "ok"}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ready"}]
    images = [{"names": [f"registry.example/team/image-{i}@sha256:{'a' * 64}"],
               "sizeBytes": 1_000_000 * i} for i in range(8)]
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "12345",
                     "labels": labels,
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     "volumes.kubernetes.io/controller-managed-attach-detach":
                                         "true"}},
        "spec": {"podCIDR": "10.1.0.0/24", "providerID": f"aws:///zone-a/{name}"},
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152Mi", "pods": "110",
                         "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "191", "memory": "2000000Mi", "pods": "110",
                            "nvidia.com/gpu": str(gpus)},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.36.3", "containerRuntimeVersion": "containerd://2.1",
                         "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04",
                         "architecture": "amd64", "operatingSystem": "linux"},
            "images": images,
        },
    }


def fleet(n: int, seed: int = 7, now: float = 1_800_000_000.0):
    """(nodes, pods, telemetry) for n 8-GPU nodes, about half their GPUs allocated."""
    rng = random.Random(seed)
    nodes, pods, readings = [], [], {}
    for i in range(n):
        name = f"gpu-node-{i:05d}"
        product = PRODUCTS[i % len(PRODUCTS)]
        nodes.append(Node(name=name, product=product, gpus=8,
                          labels={"nvidia.com/gpu.product": product}))
        used = rng.randint(0, 8)
        for j in range(used):
            pods.append(Pod(namespace="ml", name=f"p-{i}-{j}", uid=f"u-{i}-{j}", gpus=1, node=name,
                            phase="Running", bound_at=now - 3600))
        readings[name] = tuple(
            GpuReading(node=name, gpu=str(g), util=rng.random() if g < used else 0.0,
                       temp_c=40 + rng.random() * 30, sampled_at=now - 5,
                       pod=f"ml/p-{i}-{g}" if g < used else None)
            for g in range(8)
        )
    return nodes, pods, Telemetry(nodes=readings, fetched_at=now)
