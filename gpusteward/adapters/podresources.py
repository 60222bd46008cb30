"""Which pod holds which GPU: the kubelet's PodResources API (``v1.PodResourcesLister/List``).

The kubelet serves it over gRPC on a unix socket, by default
``/var/lib/kubelet/pod-resources/kubelet.sock``. For the NVIDIA device plugin each device id is
the GPU's NVML UUID, or ``<uuid>::<n>`` for the n-th time-sliced (or MPS) replica of one GPU.
The response has no pod UID, only namespace and name. A GPU a DRA claim holds is listed under
the container's ``dynamic_resources`` by driver, pool and device name (kubelet feature
``KubeletPodResourcesDynamicResources``, beta in 1.34); ``adapters.dradevices`` gives its UUID.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import grpc

from gpusteward.adapters._podresources import api_pb2, api_pb2_grpc
from gpusteward.adapters.dradevices import DeviceKey, DraDevices
from gpusteward.adapters.errors import AdapterError
from gpusteward.core.nodereadings import DeviceAssignment, PodRef

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCES = ("nvidia.com/gpu",)
GPU_RESOURCE_PREFIXES = ("nvidia.com/mig-",)
REPLICA_SEPARATOR = "::"

__all__ = ["DEFAULT_SOCKET", "PodResourcesClient", "PodResourcesUnavailable", "assignments"]


class PodResourcesUnavailable(AdapterError):
    """The kubelet socket is missing or does not answer."""


def is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(GPU_RESOURCE_PREFIXES)


def split_device_id(device_id: str) -> tuple[str, str | None]:
    """``"GPU-1::3"`` -> ``("GPU-1", "3")``; a plain UUID has no replica."""
    uuid, sep, replica = device_id.partition(REPLICA_SEPARATOR)
    return uuid, (replica if sep else None)


def assignments(response: api_pb2.ListPodResourcesResponse,
                dra_uuids: Mapping[DeviceKey, str] | None = None,
                ) -> tuple[DeviceAssignment, ...]:
    """Every GPU device id in a List response, with the pod and container holding it; DRA
    devices where ``dra_uuids`` knows their GPU."""
    found: list[DeviceAssignment] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, name=pod.name, container=container.name)
            found += _devices(ref, container.devices)
            found += [DeviceAssignment(uuid=dra_uuids[key], pod=ref)
                      for key in _dra_keys(container) if dra_uuids and key in dra_uuids]
    return tuple(found)


def _dra_keys(container: api_pb2.ContainerResources) -> list[DeviceKey]:
    return [(r.driver_name, r.pool_name, r.device_name) for d in container.dynamic_resources
            for r in d.claim_resources if r.device_name]


def dra_devices(response: api_pb2.ListPodResourcesResponse) -> set[DeviceKey]:
    return {key for pod in response.pod_resources for c in pod.containers
            for key in _dra_keys(c)}


def _devices(
    ref: PodRef, devices: Iterable[api_pb2.ContainerDevices]
) -> list[DeviceAssignment]:
    return [
        DeviceAssignment(uuid=uuid, replica=replica, pod=ref)
        for device in devices
        if is_gpu_resource(device.resource_name)
        for uuid, replica in map(split_device_id, device.device_ids)
    ]


class PodResourcesClient:
    """One List call per collection; a fresh channel each time, so a restarted kubelet is found."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0):
        self.socket_path = socket_path
        self.timeout = timeout

    async def list(self, dra: DraDevices | None = None) -> tuple[DeviceAssignment, ...]:
        """``dra``: where the UUIDs of DRA-allocated devices come from (none: left out)."""
        if not os.path.exists(self.socket_path):
            raise PodResourcesUnavailable(f"no kubelet socket at {self.socket_path}")
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.socket_path}") as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                response = await stub.List(api_pb2.ListPodResourcesRequest(),
                                           timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            raise PodResourcesUnavailable(
                f"kubelet at {self.socket_path}: {e.code().name}: {e.details()}"
            ) from e
        keys = dra_devices(response)
        return assignments(response, await dra.uuids(keys) if dra and keys else None)
