"""Small factories for fresh test objects (pure model values)."""

from __future__ import annotations

from gpusteward.core.model import GpuReading, Node, Pod
from gpusteward.core.nodestate import NodeState, build_node_state
from gpusteward.core.policy import Health

NOW = 1_800_000_000.0
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
A10 = "NVIDIA-A10"
L4 = "NVIDIA-L4"


def node(name: str = "n1", product: str | None = H100, gpus: int = 8, **kw) -> Node:
    return Node(name=name, product=product, gpus=gpus, **kw)


def pod(name: str = "p", node: str | None = "n1", gpus: int = 1, ns: str = "ml", **kw) -> Pod:
    return Pod(namespace=ns, name=name, uid=f"uid-{ns}-{name}", gpus=gpus, node=node,
               phase="Running" if node else "Pending", **kw)


def readings(node_name: str = "n1", utils: list[float] | None = None, *, at: float = NOW - 5,
             temp: float = 40.0, xid: dict[int, int] | None = None,
             pods: dict[int, str] | None = None) -> tuple[GpuReading, ...]:
    utils = [0.0] * 8 if utils is None else utils
    xid = xid or {}
    pods = pods or {}
    return tuple(
        GpuReading(node=node_name, gpu=str(i), util=u, temp_c=temp, xid=xid.get(i, 0),
                   sampled_at=at, pod=pods.get(i))
        for i, u in enumerate(utils)
    )


def state(n: Node | None = None, *, tier: str | None = "premium", pods: list[Pod] = (),
          gpu_readings: tuple[GpuReading, ...] | None = (), health: Health | None = None,
          now: float = NOW, stale_after: float = 120.0, warmup: float = 0.0) -> NodeState:
    n = n or node()
    if gpu_readings == ():
        gpu_readings = readings(n.name, [0.0] * n.gpus)
    return build_node_state(n, tier, pods, gpu_readings or (), health or Health(), now, stale_after,
                            warmup=warmup)
