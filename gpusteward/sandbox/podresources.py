"""The kubelet's PodResources API for fake nodes: ``v1.PodResourcesLister/List`` on a unix socket.

kwok nodes have no kubelet, so the sandbox serves what the kubelet would, from the upstream
podresources v1 proto: each container's devices by resource name, GPU device ids being NVML
UUIDs (``uuid::N`` for a time-sliced replica), as the NVIDIA device plugin reports them, and
each container's DRA claims' devices by driver, pool and device name (``dynamic_resources``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpusteward.adapters._podresources import api_pb2, api_pb2_grpc
from gpusteward.sandbox.procs import SandboxError

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

__all__ = ["Holder", "PodResourcesServer", "check_socket_path"]


@dataclass(frozen=True)
class Holder:
    """One container holding device ids (``uuid`` or ``uuid::replica``) of one resource."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]
    resource: str = "nvidia.com/gpu"
    # A DRA claim's devices instead: (claim name, ((driver, pool, device), ...)).
    claim: tuple[str, tuple[tuple[str, str, str], ...]] | None = None


def list_response(holders: list[Holder]) -> api_pb2.ListPodResourcesResponse:
    pods: dict[tuple[str, str], api_pb2.PodResources] = {}
    for h in holders:
        pod = pods.setdefault((h.namespace, h.pod),
                              api_pb2.PodResources(name=h.pod, namespace=h.namespace))
        container = pod.containers.add(name=h.container)
        if h.device_ids:
            container.devices.add(resource_name=h.resource, device_ids=list(h.device_ids))
        if h.claim is not None:
            name, devices = h.claim
            container.dynamic_resources.add(claim_name=name, claim_namespace=h.namespace,
                                            claim_resources=[api_pb2.ClaimResource(
                                                driver_name=d, pool_name=p, device_name=n)
                                                for d, p, n in devices])
    return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))


def check_socket_path(path: Path) -> None:
    if len(str(path).encode()) > MAX_SOCKET_PATH:
        raise SandboxError(f"unix socket path too long ({MAX_SOCKET_PATH} bytes at most): "
                           f"{path}; use a shorter state directory")


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesServer) -> None:
        self.server = server

    async def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.server.calls += 1
        return list_response(self.server.holders)


class PodResourcesServer:
    """Serves ``holders`` (replace the list to change the answer) until ``stop``."""

    def __init__(self, socket_path: Path) -> None:
        check_socket_path(socket_path)
        self.socket_path = socket_path
        self.holders: list[Holder] = []
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket_path.unlink(missing_ok=True)  # left by a killed run: the bind would fail
        self._server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
