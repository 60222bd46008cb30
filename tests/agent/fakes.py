"""Test doubles that speak the real protocols: a C libnvidia-ml and a gRPC kubelet socket."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpusteward.agent._podresources import api_pb2, api_pb2_grpc

SOURCE = Path(__file__).parent / "fakenvml" / "fakenvml.c"
SONAME = "libnvidia-ml.so.1"
GIB = 1 << 30


def build_fakenvml(out_dir: Path, *defines: str) -> Path:
    """Compile fakenvml.c into ``out_dir/libnvidia-ml.so.1`` (soname libnvidia-ml.so.1)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("a C compiler (cc) is needed to build the NVML test library")
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / SONAME
    flags = [f"-D{d}" for d in defines]
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *flags,
         f"-Wl,-soname,{SONAME}", "-o", str(lib), str(SOURCE)],
        check=True, capture_output=True, text=True,
    )
    return lib


def preload(lib: Path) -> None:
    """Load ``lib`` so pynvml's ``CDLL("libnvidia-ml.so.1")`` resolves to it by soname."""
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:07:00.0"
    util_gpu: int = 0
    util_memory: int = 0
    memory_total: int = 80 * GIB
    memory_used: int = 0
    temperature: int = 35
    power_mw: int = 70_000
    processes: list[dict[str, int]] = field(default_factory=list)
    process_utilization: list[dict[str, int]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


class FakeNvml:
    """Writes the JSON the C library reads; it re-reads it on every nvmlDeviceGetCount_v2."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, gpus: list[FakeGpu], *, driver_version: str = "550.90.07",
              init_error: str | None = None) -> None:
        config: dict[str, Any] = {"driver_version": driver_version,
                                  "gpus": [vars(g) for g in gpus]}
        if init_error:
            config["init_error"] = init_error
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        tmp.replace(self.path)


@dataclass(frozen=True)
class Holder:
    """One container holding GPU device ids (``uuid`` or ``uuid::replica``)."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]
    resource: str = "nvidia.com/gpu"


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    async def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:  # noqa: N802
        self.kubelet.calls += 1
        return self.kubelet.response()


class FakeKubelet:
    """``v1.PodResourcesLister`` on a unix socket, built from the upstream proto."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.holders: list[Holder] = []
        self.calls = 0
        self._server: grpc.aio.Server | None = None

    def response(self) -> api_pb2.ListPodResourcesResponse:
        pods: dict[tuple[str, str], api_pb2.PodResources] = {}
        for h in self.holders:
            pod = pods.setdefault((h.namespace, h.pod),
                                  api_pb2.PodResources(name=h.pod, namespace=h.namespace))
            container = pod.containers.add(name=h.container)
            container.devices.add(resource_name=h.resource, device_ids=list(h.device_ids))
        return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))

    async def start(self) -> None:
        self._server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)


def write_proc(root: Path, pid: int, cgroup: str, hostname: str | None = None) -> None:
    """A ``/proc/<pid>`` with the two files pidmap reads."""
    d = root / str(pid)
    d.mkdir()
    (d / "cgroup").write_text(cgroup)
    env = [b"PATH=/usr/bin"] + ([f"HOSTNAME={hostname}".encode()] if hostname else [])
    (d / "environ").write_bytes(b"\0".join(env) + b"\0")
