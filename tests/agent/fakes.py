"""Test doubles that speak the real protocols: the sandbox's C libnvidia-ml (driven by JSON) and
its gRPC kubelet PodResources socket, plus a fake ``/proc``."""

from __future__ import annotations

import ctypes
from pathlib import Path

from gpusteward.sandbox.fakenvml import GIB, FakeGpu, build_fakenvml, write_config
from gpusteward.sandbox.podresources import Holder
from gpusteward.sandbox.podresources import PodResourcesServer as FakeKubelet

__all__ = ["GIB", "FakeGpu", "FakeKubelet", "FakeNvml", "Holder", "build_fakenvml", "preload",
           "write_proc"]


def preload(lib: Path) -> None:
    """Load ``lib`` so pynvml's ``CDLL("libnvidia-ml.so.1")`` resolves to it by soname."""
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


class FakeNvml:
    """Writes the JSON the C library reads; it re-reads it on every nvmlDeviceGetCount_v2."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, gpus: list[FakeGpu], *, driver_version: str = "550.90.07",
              init_error: str | None = None) -> None:
        write_config(self.path, gpus, driver_version=driver_version, init_error=init_error)


def write_proc(root: Path, pid: int, cgroup: str, hostname: str | None = None) -> None:
    """A ``/proc/<pid>`` with the two files pidmap reads."""
    d = root / str(pid)
    d.mkdir()
    (d / "cgroup").write_text(cgroup)
    env = [b"PATH=/usr/bin"] + ([f"HOSTNAME={hostname}".encode()] if hostname else [])
    (d / "environ").write_bytes(b"\0".join(env) + b"\0")
